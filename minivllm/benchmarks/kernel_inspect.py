"""What the compiler made of the unified attention kernel, without a GPU.

``python -m minivllm.benchmarks.kernel_inspect`` compiles ``kernel_unified_attention`` for
a GPU target (sm_90, the H100/H200, by default) on any machine with Triton's CUDA
toolchain (it ships ``ptxas`` and ``cuobjdump``; no driver or device is used) and reports,
per launch configuration: registers and spill stack per thread, shared memory, how many
buffers the software pipeline gave each K/V tile, and how the tiles move (``cp.async``
gathers, TMA copies) and multiply (``wgmma`` on Hopper's tensor cores, ``mma.sync``).

This is how the third round found that 16-row decode tiles kept a single K/V buffer below
5 stages (the block-table load takes a pipeline stage of its own), so no tile was in
flight while the previous one was being used. Configurations are given as
``block_m,tile_n,warps,stages,segments,fused,new_kv``; the default list is the launch-config
rule's families for the Qwen3-0.6B shape (16 query heads, 8 KV heads, head size 128, bf16
cache, 16-token blocks). Run it with ``TRITON_INTERPRET`` unset.
"""

from __future__ import annotations

import argparse
import json
import os
import re
import subprocess
import tempfile
from pathlib import Path

import triton

from minivllm.attention.triton_launch_config import AttentionLaunchConfig

# The Qwen3-0.6B attention shape of the other kernel benchmarks.
SHAPE = {"NUM_HEADS": 16, "GROUP": 2, "HEAD_SIZE": 128, "HEAD_PAD": 128, "BLOCK_SIZE": 16}
# Integer arguments the launcher sees as multiples of 16 (Triton specializes on that);
# the kernel's do_not_specialize list is left generic, as at run time.
_POINTER_TYPES = {
    "block_table_ptr": "i32",
    "seq_lens_ptr": "i32",
    "query_start_loc_ptr": "i32",
    "seq_order_ptr": "i64",
    "counter_ptr": "i32",
    "part_out_ptr": "fp32",
    "part_max_ptr": "fp32",
    "part_sum_ptr": "fp32",
}
DEFAULT_CONFIGS = (
    AttentionLaunchConfig(16, 64, 4, 2, 64, True),
    AttentionLaunchConfig(16, 128, 4, 3, 1),
    AttentionLaunchConfig(128, 128, 8, 2, 4),
    AttentionLaunchConfig(128, 128, 8, 3, 1, new_kv=2),
)


def _source(config: AttentionLaunchConfig, dtype: str):
    """The kernel with ``config``'s constants bound and every other argument typed."""
    from triton.compiler import ASTSource

    from minivllm.attention.triton_unified_attention import kernel_unified_attention as kernel

    constants = {
        **SHAPE,
        "BLOCK_M": config.block_m,
        "BLOCK_Q": config.block_m // SHAPE["GROUP"],
        "TILE_N": config.tile_n,
        "NUM_SEGMENTS": config.num_segments,
        "FUSED_REDUCE": config.fused_reduce and config.num_segments > 1,
        "NEW_KV": config.new_kv if config.num_segments == 1 else 0,
        "SEQ_ORDER": False,  # the kernel's own q-block walk, as every launch before
        "DOT_PRECISION": "tf32",
        "UPCAST_DOT": False,
    }
    signature, divisible = {}, []
    for index, name in enumerate(kernel.arg_names):
        if name in constants:
            signature[name] = "constexpr"
        elif name in ("key_desc", "value_desc"):
            if constants["NEW_KV"] == 2:
                signature[name] = f"tensordesc<{dtype}[{config.tile_n}, {SHAPE['HEAD_SIZE']}]>"
            else:
                signature[name], constants[name] = "constexpr", None
        elif name.endswith("_ptr"):
            signature[name] = "*" + _POINTER_TYPES.get(name, dtype)
            if name not in kernel.do_not_specialize:
                divisible.append(index)
        elif name == "qk_scale":
            signature[name] = "fp32"
        else:
            signature[name] = "i32" if name == "num_seqs" else "i64"
            if name.startswith("stride") and name not in kernel.do_not_specialize:
                divisible.append(index)
    return ASTSource(
        fn=kernel,
        signature=signature,
        constexprs={(kernel.arg_names.index(k),): v for k, v in constants.items()},
        attrs={(i,): [["tt.divisibility", 16]] for i in divisible},
    )


def inspect_config(config: AttentionLaunchConfig, arch: int = 90, dtype: str = "bf16") -> dict:
    """Compile ``config`` for ``sm_<arch>`` and summarise the result."""
    from triton.backends.compiler import GPUTarget

    compiled = triton.compile(
        _source(config, dtype),
        target=GPUTarget("cuda", arch, 32),
        options={"num_warps": config.num_warps, "num_stages": config.num_stages},
    )
    ptx, ttgir = compiled.asm["ptx"], compiled.asm["ttgir"]
    usage = _resource_usage(compiled.asm["cubin"])
    # Multi-buffered shared-memory allocations: "!ttg.memdesc<2x64x128xbf16" = 2 buffers.
    kv_buffers = sorted(
        {int(n) for n in re.findall(rf"memdesc<(\d+)x{config.tile_n}x\d+x{dtype}", ttgir)}
    )
    return {
        "config": config.__dict__,
        "registers": usage.get("REG"),
        "spill_stack_bytes": usage.get("STACK"),
        "shared_bytes": compiled.metadata.shared,
        "kv_tile_buffers": kv_buffers,
        "cp_async": ptx.count("cp.async.") - ptx.count("cp.async.bulk"),
        "tma_copies": ptx.count("cp.async.bulk.tensor"),
        "wgmma": ptx.count("wgmma.mma_async"),
        "mma_sync": ptx.count("mma.sync"),
    }


def _resource_usage(cubin: bytes) -> dict[str, int]:
    """``REG``, ``STACK``, ... of the kernel, from ``cuobjdump --dump-resource-usage``."""
    tool = Path(triton.__file__).parent / "backends" / "nvidia" / "bin" / "cuobjdump"
    with tempfile.TemporaryDirectory() as tmp:
        path = Path(tmp) / "kernel.cubin"
        path.write_bytes(cubin)
        text = subprocess.run(
            [str(tool), "--dump-resource-usage", str(path)],
            capture_output=True,
            text=True,
            check=True,
        ).stdout
    return {k: int(v) for k, v in re.findall(r"\b([A-Z]+):(\d+)", text.split("Function")[-1])}


def _parse_config(text: str) -> AttentionLaunchConfig:
    fields = [int(x) for x in text.split(",")]
    if not 4 <= len(fields) <= 7:
        raise argparse.ArgumentTypeError(
            f"--config wants block_m,tile_n,warps,stages[,segments,fused,new_kv], got {text!r}"
        )
    block_m, tile_n, warps, stages, *rest = fields
    segments, fused, new_kv = (rest + [1, 0, 0][len(rest) :])[:3]
    return AttentionLaunchConfig(block_m, tile_n, warps, stages, segments, bool(fused), new_kv)


def main(argv: list[str] | None = None) -> None:
    """Entry point: ``python -m minivllm.benchmarks.kernel_inspect [--config ...]``."""
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument(
        "--config",
        type=_parse_config,
        action="append",
        help="block_m,tile_n,warps,stages[,segments,fused,new_kv]; repeatable",
    )
    parser.add_argument("--arch", type=int, default=90, help="compute capability, e.g. 90")
    parser.add_argument("--output", help="also write the rows as JSON here")
    args = parser.parse_args(argv)
    if os.environ.get("TRITON_INTERPRET") == "1":
        parser.exit(2, f"{parser.prog}: error: unset TRITON_INTERPRET (it compiles for a GPU)\n")
    rows = []
    for config in args.config or DEFAULT_CONFIGS:
        row = inspect_config(config, args.arch)
        rows.append(row)
        c = config
        print(
            f"{c.block_m}x{c.tile_n} w{c.num_warps} s{c.num_stages} seg{c.num_segments} "
            f"kv{c.new_kv}: {row['registers']} regs, {row['spill_stack_bytes']} B stack, "
            f"{row['shared_bytes']} B shared, K/V buffers {row['kv_tile_buffers']}, "
            f"cp.async {row['cp_async']}, TMA {row['tma_copies']}, wgmma {row['wgmma']}, "
            f"mma.sync {row['mma_sync']}",
            flush=True,
        )
    if args.output:
        result = {
            "triton": triton.__version__,
            "arch": f"sm_{args.arch}",
            "shape": SHAPE,
            "rows": rows,
        }
        Path(args.output).write_text(json.dumps(result, indent=2) + "\n")


if __name__ == "__main__":
    main()
