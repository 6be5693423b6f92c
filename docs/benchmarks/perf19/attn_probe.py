"""Call 1: the workload's prompt steps' attention, three ways, against torch's flash varlen."""
import json, sys, itertools
import torch
sys.path.insert(0, "scratch_gpu/s25")
from prompt_steps import prompt_steps
from minivllm.attention.triton_launch_config import select_config, AttentionLaunchConfig
from minivllm.benchmarks.kernel_sweep_workload import batch_inputs, prefill_flops, time_config
from minivllm.benchmarks.kernel import _bench_graph
from minivllm.benchmarks.kernel_inputs import NUM_HEADS, NUM_KV_HEADS, HEAD_SIZE

LAYERS = 28


def cfg(tokens, seqs, max_q, max_seq=4096):
    return select_config(num_tokens=tokens, num_seqs=seqs, num_heads=NUM_HEADS,
                         num_kv_heads=NUM_KV_HEADS, max_query_len=max_q, max_seq_len=max_seq,
                         device=torch.device("cuda"), head_size=HEAD_SIZE)


def padded(seqs, n=256):
    return seqs + [(0, 0)] * (n - len(seqs))


def flash_ms(seqs, seed):
    """torch's flash attention (varlen, GQA) on the same prompts: dense q/k/v."""
    g = torch.Generator(device="cuda").manual_seed(seed)
    tq = sum(n for _, n in seqs); tk = sum(c + n for c, n in seqs)
    q = torch.randn(tq, NUM_HEADS, HEAD_SIZE, dtype=torch.bfloat16, device="cuda", generator=g)
    k = torch.randn(tk, NUM_KV_HEADS, HEAD_SIZE, dtype=torch.bfloat16, device="cuda", generator=g)
    v = torch.randn_like(k)
    cq = torch.tensor([0, *itertools.accumulate(n for _, n in seqs)], dtype=torch.int32, device="cuda")
    ck = torch.tensor([0, *itertools.accumulate(c + n for c, n in seqs)], dtype=torch.int32, device="cuda")
    mq = max(n for _, n in seqs); mk = max(c + n for c, n in seqs)
    fn = lambda: torch.ops.aten._flash_attention_forward(q, k, v, cq, ck, mq, mk, 0.0, True, False,
                                                         scale=HEAD_SIZE ** -0.5)
    fn()
    return _bench_graph(fn)


def main(out):
    steps = prompt_steps()
    rows = []
    for i, seqs in enumerate(steps):
        dec = [s for s in seqs if s[1] == 1 and s[0] > 0]
        pro = [s for s in seqs if not (s[1] == 1 and s[0] > 0)]
        tokens = sum(n for _, n in seqs)
        row = {"step": i, "num_seqs": len(seqs), "num_decodes": len(dec), "tokens": tokens,
               "prompt_flops": prefill_flops(pro), "max_new": max(n for _, n in pro)}
        pad = padded(seqs)
        inp = batch_inputs(pad, i)
        c = cfg(16384, 256, 16384)
        row["graph_cfg"] = c.__dict__
        row["graph_single_ms"] = time_config(inp, c)
        inp_p = batch_inputs(pro, 100 + i)
        cp = cfg(sum(n for _, n in pro), len(pro), max(n for _, n in pro))
        row["prompts_cfg"] = cp.__dict__
        row["prompts_ms"] = time_config(inp_p, cp)
        row["prompts_tflops"] = row["prompt_flops"] / row["prompts_ms"] / 1e9
        for alt in ((128, 64, 8, 3), (128, 128, 8, 3), (64, 64, 4, 2), (64, 128, 4, 2)):
            a = AttentionLaunchConfig(*alt, 1, new_kv=2)
            try:
                row[f"prompts_ms_{'_'.join(map(str, alt))}"] = time_config(inp_p, a)
            except Exception as e:
                row[f"prompts_ms_{'_'.join(map(str, alt))}"] = repr(e)[:100]
        if dec:
            inp_d = batch_inputs(dec, 200 + i)
            cd = cfg(len(dec), len(dec), 1, 4096)
            order = torch.argsort(inp_d["seq_lens"], descending=True)
            cd = select_config(num_tokens=len(dec), num_seqs=len(dec), num_heads=NUM_HEADS,
                               num_kv_heads=NUM_KV_HEADS, max_query_len=1, max_seq_len=4096,
                               device=torch.device("cuda"), head_size=HEAD_SIZE, ordered=True)
            row["decodes_cfg"] = cd.__dict__
            row["decodes_ms"] = time_config(inp_d, cd, seq_order=order)
        try:
            row["flash_prompts_ms"] = flash_ms(pro, 300 + i)
            row["flash_tflops"] = row["prompt_flops"] / row["flash_prompts_ms"] / 1e9
        except Exception as e:
            row["flash_error"] = repr(e)[:300]
        print(json.dumps({k: (round(v, 4) if isinstance(v, float) else v) for k, v in row.items() if "cfg" not in k}), flush=True)
        rows.append(row)
    tot = lambda k: sum(r.get(k, 0) or 0 for r in rows if isinstance(r.get(k, 0), float)) * LAYERS
    summary = {k: tot(k) for k in ("graph_single_ms", "prompts_ms", "decodes_ms", "flash_prompts_ms")}
    print("per run, ms (x28 layers):", summary)
    json.dump({"rows": rows, "per_run_ms": summary, "torch": torch.__version__,
               "gpu": torch.cuda.get_device_name()}, open(out, "w"), indent=1)


if __name__ == "__main__":
    main(sys.argv[1])
