"""Why a prompt step's attention takes ~1 ms more inside a prefill graph than eagerly:
time a mixed step's attention (Qwen3-0.6B shape: decodes beside prompts, 16,384 tokens)
as the eager step launches it (DecodeSplit: decodes on decode tiles, then the prompts)
and as the prefill graph does (one launch on prefill tiles, 256 sequences, max_seq_len
4,096), and variants that separate the causes. Usage: python3 pad_seqs.py OUT.json"""
import json, sys
import torch
from minivllm.attention.backends.triton_attn import paged_attention

torch.manual_seed(0)
dev, dt = "cuda", torch.bfloat16
H, KVH, D, BS = 16, 8, 128, 16
g = torch.Generator().manual_seed(1)
prompt_lens = []
ND = 220
while sum(prompt_lens) < 16384 - ND - 100:
    prompt_lens.append(int(torch.randint(100, 1025, (1,), generator=g)))
prompt_lens[-1] -= sum(prompt_lens) - (16384 - ND)
dec_ctx = torch.randint(500, 1500, (ND,), generator=g).tolist()
nd, npf = len(dec_ctx), len(prompt_lens)
T = nd + sum(prompt_lens)
seq_lens = dec_ctx + prompt_lens
blocks = [-(-L // BS) for L in seq_lens]
nblocks = sum(blocks) + 8
kc = torch.randn(nblocks, BS, KVH, D, device=dev, dtype=dt)
vc = torch.randn_like(kc)
perm = torch.randperm(nblocks - 8, generator=g)
width = 4096 // BS
bt = torch.zeros(len(seq_lens), width, dtype=torch.int32)
o = 0
for i, b in enumerate(blocks):
    bt[i, :b] = perm[o:o + b]; o += b
bt = bt.to(dev)
q = torch.randn(T, H, D, device=dev, dtype=dt)
k = torch.randn(T, KVH, D, device=dev, dtype=dt)
v = torch.randn_like(k)
ql = [1] * nd + prompt_lens
qsl = torch.tensor([0] + torch.tensor(ql).cumsum(0).tolist(), dtype=torch.int32, device=dev)
sl = torch.tensor(seq_lens, dtype=torch.int32, device=dev)
order = torch.argsort(sl[:nd], descending=True)
scale = D ** -0.5
out = torch.empty_like(q)

def t(fn, reps=30):
    for _ in range(3): fn()
    torch.cuda.synchronize()
    ev = [(torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)) for _ in range(reps)]
    for a, b in ev:
        a.record(); fn(); b.record()
    torch.cuda.synchronize()
    xs = sorted(a.elapsed_time(b) * 1e3 for a, b in ev)
    return xs[len(xs) // 2]

res = {"num_decodes": nd, "num_prompts": npf, "tokens": T}
# eager split: two batches, each its own
res["eager_decode_us"] = t(lambda: paged_attention(q[:nd], kc, vc, bt[:nd], sl[:nd], qsl[:nd + 1], scale, out=out[:nd], max_query_len=1, max_seq_len=max(dec_ctx), seq_order=order))
pq = (qsl[nd:] - nd).contiguous()
res["eager_prefill_us"] = t(lambda: paged_attention(q[nd:], kc, vc, bt[nd:], sl[nd:], pq, scale, out=out[nd:], max_query_len=max(prompt_lens), max_seq_len=max(seq_lens[nd:]), key=k[nd:], value=v[nd:]))
# the prefill graph: one launch over every row, cap = 256 sequences (empty after the
# real ones), max_query_len = the graph size, max_seq_len = max_model_len (4,096)
cap = 256
n_all = nd + npf
assert n_all <= cap, n_all
qsl_cap = torch.full((cap + 1,), T, dtype=torch.int32, device=dev); qsl_cap[: n_all + 1] = qsl
sl_cap = torch.zeros(cap, dtype=torch.int32, device=dev); sl_cap[:n_all] = sl
bt_cap = torch.zeros(cap, width, dtype=torch.int32, device=dev); bt_cap[:n_all] = bt
res["graph_single_us"] = t(lambda: paged_attention(q, kc, vc, bt_cap, sl_cap, qsl_cap, scale, out=out, max_query_len=T, max_seq_len=4096, key=k, value=v))
res["single_unpadded_us"] = t(lambda: paged_attention(q, kc, vc, bt, sl, qsl, scale, out=out, max_query_len=max(prompt_lens), max_seq_len=max(seq_lens), key=k, value=v))
# which part: the prompts alone but 256 sequences (trailing empty), or max_seq_len 4096 alone
tail_q = torch.full((cap + 1,), T - nd, dtype=torch.int32, device=dev); tail_q[: npf + 1] = pq
tail_sl = torch.zeros(cap, dtype=torch.int32, device=dev); tail_sl[:npf] = sl[nd:]
tail_bt = torch.zeros(cap, width, dtype=torch.int32, device=dev); tail_bt[:npf] = bt[nd:]
res["prefill_256_trailing_us"] = t(lambda: paged_attention(q[nd:], kc, vc, tail_bt, tail_sl, tail_q, scale, out=out[nd:], max_query_len=max(prompt_lens), max_seq_len=max(seq_lens[nd:]), key=k[nd:], value=v[nd:]))
res["prefill_max_seq_4096_us"] = t(lambda: paged_attention(q[nd:], kc, vc, bt[nd:], sl[nd:], pq, scale, out=out[nd:], max_query_len=max(prompt_lens), max_seq_len=4096, key=k[nd:], value=v[nd:]))
res["prefill_max_query_T_us"] = t(lambda: paged_attention(q[nd:], kc, vc, bt[nd:], sl[nd:], pq, scale, out=out[nd:], max_query_len=T, max_seq_len=max(seq_lens[nd:]), key=k[nd:], value=v[nd:]))
# the graph's one launch gives the eager split's rows
ref = torch.empty_like(q); got = torch.empty_like(q)
paged_attention(q[:nd], kc, vc, bt[:nd], sl[:nd], qsl[:nd + 1], scale, out=ref[:nd], max_query_len=1, max_seq_len=max(dec_ctx), seq_order=order)
paged_attention(q[nd:], kc, vc, bt[nd:], sl[nd:], pq, scale, out=ref[nd:], max_query_len=max(prompt_lens), max_seq_len=max(seq_lens[nd:]), key=k[nd:], value=v[nd:])
paged_attention(q, kc, vc, bt_cap, sl_cap, qsl_cap, scale, out=got, max_query_len=T, max_seq_len=4096, key=k, value=v)
res["graph_vs_eager_max_abs_diff"] = float((ref.float() - got.float()).abs().max())
print(json.dumps(res, indent=1))
json.dump(res, open(sys.argv[1], "w"), indent=1)
