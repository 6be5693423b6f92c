"""``minivllm bench soak``: thousands of random requests, then proof nothing went wrong.

A soak test is a reliability check, not a speed one (issue 19). It sends a seeded
random workload (``soak_workload.py``: every sampling parameter, ``n`` up to 3, stop
strings, prompts from 1 token to nearly ``max_model_len``, shared prefixes, random
aborts) through one front end (``soak_drivers.py``) of an engine whose KV pool is small
enough that requests are preempted, and checks at the end:

1. no leaked block: the pool is back to all free (cached prefix blocks nobody holds
   count as free), and no request is left in the scheduler or the front end;
2. every finished request equals its reference run (``soak_check.py``): greedy and
   seeded random requests give the same tokens, text and finish reason as when run on
   an idle engine, except numerical near-ties of greedy requests, counted separately;
3. for ``--engine server``: ``/health`` answers 200 at the end, the server's
   ``/metrics`` report an empty pool and queue, and its finished-request counters agree
   with what the clients saw.

The JSON written to ``--output`` holds the command, the counts and the run time; the
exit status is 1 when any check failed. ``tests/engine/test_soak.py`` and
``tests/entrypoints/openai/test_soak_server.py`` run short versions in CI.
"""

from __future__ import annotations

import argparse
import asyncio
import time
from pathlib import Path
from typing import Any

from minivllm.benchmarks.common import default_output, environment, write_json
from minivllm.benchmarks.soak_check import TIE_LOGPROBS, classify, matches, reference_key
from minivllm.benchmarks.soak_check import run_reference as _run_reference
from minivllm.benchmarks.soak_drivers import DriverResult, drive_async, drive_offline
from minivllm.benchmarks.soak_server import run_server_soak
from minivllm.benchmarks.soak_workload import SoakRequest, WorkloadShape, make_workload

DEFAULT_OUTPUT = default_output("soak.json")


def add_soak_args(parser: argparse.ArgumentParser) -> None:
    """Register the options of ``minivllm bench soak``."""
    parser.add_argument(
        "--model", default=None, help="model folder (default: the demo model shipped with minivllm)"
    )
    parser.add_argument(
        "--engine",
        choices=("offline", "async", "server"),
        default="offline",
        help="the front end the workload goes through",
    )
    parser.add_argument("--num-requests", type=int, default=10_000)
    parser.add_argument("--seed", type=int, default=0, help="names the workload")
    parser.add_argument(
        "--num-kv-blocks",
        type=int,
        default=40,
        help="KV pool size: small, so that requests are preempted",
    )
    parser.add_argument("--max-model-len", type=int, default=256)
    parser.add_argument("--max-num-seqs", type=int, default=32)
    parser.add_argument(
        "--max-num-batched-tokens",
        type=int,
        default=128,
        help="small, so that long prompts are prefilled in chunks",
    )
    parser.add_argument(
        "--max-in-flight", type=int, default=64, help="requests sent and not yet ended, at most"
    )
    parser.add_argument("--abort-rate", type=float, default=0.1)
    parser.add_argument(
        "--tie-tolerance",
        type=float,
        default=1e-4,
        help="largest logprob gap between two greedy candidates that may "
        "flip between batch shapes (float rounding)",
    )
    parser.add_argument(
        "--reference-batch",
        type=int,
        default=16,
        help="requests run at once in the reference (1: each alone)",
    )
    parser.add_argument(
        "--max-seconds",
        type=float,
        default=None,
        help="stop sending new requests after this many seconds (the requests sent "
        "finish and are checked; the results count them)",
    )
    parser.add_argument("--dtype", default="float32")
    parser.add_argument("--device", default="auto")
    parser.add_argument(
        "--output",
        default=DEFAULT_OUTPUT,
        help="where the JSON goes (default: outside the committed results)",
    )


def check_args(args: argparse.Namespace) -> None:
    """Refuse out-of-range options before any engine is built (the engine's own
    arguments are checked by ``EngineArgs``).

    Raises:
        ValueError: Naming the option and its value.
    """
    for name in ("num_requests", "max_in_flight", "reference_batch"):
        value = getattr(args, name)
        if not isinstance(value, int) or value < 1:
            raise ValueError(f"--{name.replace('_', '-')} must be >= 1, got {value!r}")
    if not 0.0 <= args.abort_rate <= 1.0:
        raise ValueError(f"--abort-rate must be in [0, 1], got {args.abort_rate}")
    if not args.tie_tolerance >= 0.0:
        raise ValueError(f"--tie-tolerance must be >= 0, got {args.tie_tolerance}")
    if args.max_seconds is not None and not args.max_seconds > 0:
        raise ValueError(f"--max-seconds must be > 0, got {args.max_seconds}")


def engine_kwargs(args: argparse.Namespace) -> dict[str, Any]:
    """The engine arguments of the soaked engine."""
    return dict(
        device=args.device,
        dtype=args.dtype,
        num_kv_blocks=args.num_kv_blocks,
        max_model_len=args.max_model_len,
        max_num_seqs=args.max_num_seqs,
        max_num_batched_tokens=args.max_num_batched_tokens,
        seed=0,
    )


def reference_engine(model: str, args: argparse.Namespace) -> Any:
    """An engine for reference runs: same model and dtype, prefix caching off, a pool
    that holds ``--reference-batch`` requests of 3 samples at full length."""
    from minivllm.engine.arg_utils import EngineArgs
    from minivllm.engine.llm_engine import LLMEngine

    per_request = 3 * -(-args.max_model_len // 16)
    return LLMEngine.from_engine_args(
        EngineArgs(
            model=model,
            device=args.device,
            dtype=args.dtype,
            max_model_len=args.max_model_len,
            num_kv_blocks=max(per_request * args.reference_batch, 2 * per_request),
            max_num_seqs=3 * args.reference_batch,
            enable_prefix_caching=False,
            seed=0,
        )
    )


def workload_shape(tokenizer: Any, vocab_size: int, args: argparse.Namespace) -> WorkloadShape:
    """Bounds of the workload for this model; stop token ids are its common words."""
    stop_ids: tuple[int, ...] = ()
    if tokenizer is not None:
        ids = [tokenizer.encode(w, add_special_tokens=False) for w in (" the", " and", ",", ".")]
        stop_ids = tuple(i[0] for i in ids if len(i) == 1)
    return WorkloadShape(
        vocab_size=vocab_size,
        max_model_len=args.max_model_len,
        stop_token_ids=stop_ids,
        abort_rate=args.abort_rate,
    )


def check_against_reference(
    workload: list[SoakRequest], result: DriverResult, ref_engine: Any, args: argparse.Namespace
) -> dict[str, Any]:
    """Compare every finished, comparable request with its reference run; rerun each
    that differs alone, with logprobs, to tell a near-tie from a mismatch."""
    done = [r for r in workload if result.observed[r.index].finished and r.comparable]
    reference = _run_reference(ref_engine, done, args.reference_batch)
    counts = {"compared": len(done), "matched": 0, "ties": 0, "reference_flips": 0, "mismatches": 0}
    margins: list[float] = []
    examples: list[dict[str, Any]] = []
    for r in done:
        seen = result.observed[r.index]
        if matches(seen, reference[reference_key(r)]):
            counts["matched"] += 1
            continue
        solo = _run_reference(ref_engine, [r], 1, logprobs=TIE_LOGPROBS)[reference_key(r)]
        verdict, margin = classify(seen, r, solo, args.tie_tolerance, ref_engine.tokenizer)
        counts[{"tie": "ties", "reference_flip": "reference_flips"}.get(verdict, "mismatches")] += 1
        if margin is not None and verdict == "tie":
            margins.append(margin)
        if verdict == "mismatch" and len(examples) < 10:
            examples.append(_example(r, seen, solo, margin))
    return {**counts, "tie_margins": margins, "mismatch_examples": examples}


def _example(r: SoakRequest, seen: Any, solo: Any, margin: float | None) -> dict[str, Any]:
    return {
        "index": r.index,
        "prompt_len": len(r.prompt_token_ids),
        "params": repr(r.params),
        "margin": margin,
        "seen": {i: [c.token_ids, c.text, c.finish_reason] for i, c in seen.completions.items()},
        "solo": [[c.token_ids, c.text, c.finish_reason] for c in solo],
    }


def run_soak(args: argparse.Namespace, in_thread: bool = False) -> dict[str, Any]:
    """Run the soak test described by ``args``; return (and write) its results.

    ``in_thread`` runs ``AsyncLLM``'s engine core in a thread instead of a process of
    its own (same sockets and code; the tests use it to save the process start).
    """
    from minivllm.demo import demo_model_path
    from minivllm.engine.arg_utils import EngineArgs

    check_args(args)
    model = args.model or str(demo_model_path())
    t0 = time.perf_counter()
    ref_engine = reference_engine(model, args)
    shape = workload_shape(
        ref_engine.tokenizer, ref_engine.vllm_config.model_config.hf_config.vocab_size, args
    )
    workload = make_workload(args.num_requests, args.seed, shape)
    engine_args = EngineArgs(model=model, **engine_kwargs(args))
    deadline = time.monotonic() + args.max_seconds if args.max_seconds else None
    print(f"soak: {len(workload)} requests through the {args.engine} engine", flush=True)
    if args.engine == "offline":
        from minivllm.engine.llm_engine import LLMEngine

        engine = LLMEngine.from_engine_args(engine_args)
        try:
            result = drive_offline(
                engine, workload, args.seed, args.max_in_flight, deadline=deadline
            )
        finally:
            engine.shutdown()
    elif args.engine == "async":
        result = asyncio.run(
            _drive_async_llm(engine_args, workload, args.max_in_flight, not in_thread, deadline)
        )
    else:
        result = run_server_soak(
            model, engine_kwargs(args), workload, args.max_in_flight, args.max_seconds
        )
    soak_s = time.perf_counter() - t0
    checks = check_against_reference(workload, result, ref_engine, args)
    ref_engine.shutdown()
    out = summarize(args, workload, result, checks)
    out["seconds"] = {"soak": soak_s, "total": time.perf_counter() - t0}
    write_json(Path(args.output), out)
    print(format_summary(out), flush=True)
    return out


async def _drive_async_llm(
    engine_args: Any,
    workload: list[SoakRequest],
    max_in_flight: int,
    multiprocess: bool = True,
    deadline: float | None = None,
) -> DriverResult:
    from minivllm.engine.async_llm import AsyncLLM

    llm = AsyncLLM.from_engine_args(engine_args, multiprocess=multiprocess)
    try:
        return await drive_async(llm, workload, max_in_flight, deadline)
    finally:
        llm.shutdown()


def summarize(
    args: argparse.Namespace,
    workload: list[SoakRequest],
    result: DriverResult,
    checks: dict[str, Any],
) -> dict[str, Any]:
    """The results record: settings, counts, the checks' verdict."""
    obs = result.observed
    sent = [
        r for r in workload if obs[r.index].finished or obs[r.index].aborted or obs[r.index].error
    ]
    counts = {
        "requests_planned": len(workload),
        "requests": len(sent),
        "samples": sum(r.params.n for r in sent),
        "finished": sum(o.finished for o in obs.values()),
        "aborted": sum(o.aborted for o in obs.values()),
        "errors": sum(o.error is not None for o in obs.values()),
        "unseeded_not_compared": sum(not r.comparable for r in sent),
        **{k: v for k, v in checks.items() if isinstance(v, int)},
        "leaked_blocks": result.leaked_blocks,
        "unfinished_at_end": result.unfinished,
        "preemptions": result.stats.get("num_preemptions"),
        "prefix_cache_hit_tokens": result.stats.get("prefix_cache_hits"),
        "prefix_cache_query_tokens": result.stats.get("prefix_cache_queries"),
        "engine_steps": result.stats.get("num_steps"),
    }
    server_ok = all(result.server.get("checks", {}).values()) if result.server else True
    passed = (
        counts["mismatches"] == 0
        and counts["leaked_blocks"] == 0
        and counts["unfinished_at_end"] == 0
        and counts["errors"] == 0
        and server_ok
    )
    settings = {
        k: getattr(args, k)
        for k in (
            "engine",
            "num_requests",
            "seed",
            "num_kv_blocks",
            "max_model_len",
            "max_num_seqs",
            "max_num_batched_tokens",
            "max_in_flight",
            "abort_rate",
            "tie_tolerance",
            "reference_batch",
            "max_seconds",
            "dtype",
        )
    }
    errors = [f"{i}: {o.error}" for i, o in obs.items() if o.error][:10]
    return {
        **environment(),
        "settings": settings,
        "counts": counts,
        "passed": passed,
        "tie_margins": checks["tie_margins"],
        "mismatch_examples": checks["mismatch_examples"],
        "error_examples": errors,
        "server": result.server,
    }


def format_summary(out: dict[str, Any]) -> str:
    """One line per count, then the verdict."""
    lines = [f"  {k}: {v}" for k, v in out["counts"].items()]
    if out["server"]:
        lines.append(f"  server checks: {out['server'].get('checks')}")
    verdict = "PASSED" if out["passed"] else "FAILED"
    return "\n".join(
        ["soak results:", *lines, f"soak {verdict} in {out['seconds']['total']:.0f} s"]
    )


def run_soak_bench(args: argparse.Namespace) -> int:
    """``minivllm bench soak``: exit status 0 when every check passed, else 1."""
    return 0 if run_soak(args)["passed"] else 1
