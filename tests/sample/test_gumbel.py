"""The one-pass Gumbel-max kernel (sample/gumbel.py): in Triton's interpreter on the CPU,
compiled on a GPU.

It must draw from ``softmax(logits / T)`` (chi-square against the direct computation,
with a wrong temperature as the negative control), take the exact argmax on greedy
rows, give tokens that do not depend on the tiling, and, inside the Sampler, keep a
seeded request's tokens independent of the batch it is in.
"""

from __future__ import annotations

import os
from dataclasses import replace

import pytest
import torch

from minivllm.sample.gumbel import batch_key, gumbel_launch_config, gumbel_sample
from minivllm.sample.metadata import SamplingMetadata
from minivllm.sample.sampler import Sampler
from minivllm.sampling_params import SamplingParams
from tests.sample.reference import chi_square_pvalue
from tests.sample.test_sampler import make_request

pytestmark = pytest.mark.skipif(
    not torch.cuda.is_available() and os.environ.get("TRITON_INTERPRET") != "1",
    reason="Triton kernels need a GPU or TRITON_INTERPRET=1",
)

DEVICE = torch.device("cuda" if torch.cuda.is_available() else "cpu")
INTERPRETED = DEVICE.type != "cuda"
DRAWS = 20_000
ALPHA = 1e-3
LOGITS = torch.tensor([2.0, 1.6, 1.1, 0.9, 0.3, -0.2, -0.9, -1.5])
# 40 columns read as 8-column blocks, two per program: three programs per row, so the
# reduction across blocks and across programs (a partial last one) is on the path.
SMALL_TILES = replace(gumbel_launch_config(40, INTERPRETED), groups=2, split_size=16, num_splits=3)
# The interpreter pays per operation, not per element: there, thousands of rows a program.
ROWS_PER_PROGRAM = 4096 if INTERPRETED else 1


def _draw(logits: torch.Tensor, temperature: float, config=None, num: int = DRAWS):
    """``num`` independent draws from one logits row (one kernel row each, own key)."""
    keys = torch.arange(num, dtype=torch.int64, device=DEVICE) * 1_000_003 + 17
    config = config or gumbel_launch_config(logits.numel(), INTERPRETED)
    tokens, finite = gumbel_sample(
        logits.to(DEVICE).expand(num, -1),
        torch.full((num,), temperature, device=DEVICE),
        keys,
        torch.zeros(num, dtype=torch.int64, device=DEVICE),
        replace(config, block_rows=ROWS_PER_PROGRAM),
    )
    assert finite.all()
    return torch.bincount(tokens.cpu(), minlength=logits.numel())


@pytest.mark.parametrize("temperature", [0.6, 1.0, 1.7])
def test_draws_follow_softmax_over_temperature(temperature: float) -> None:
    counts = _draw(LOGITS, temperature)
    target = (LOGITS.double() / temperature).softmax(-1)
    assert chi_square_pvalue(counts, target) > ALPHA, (counts, target * DRAWS)


def test_draws_across_blocks_and_programs_follow_softmax() -> None:
    logits = torch.randn(40, generator=torch.Generator().manual_seed(3)) * 1.5
    logits[7] = float("-inf")  # a masked token is never drawn
    counts = _draw(logits, 0.8, SMALL_TILES)
    assert counts[7] == 0
    assert chi_square_pvalue(counts, (logits.double() / 0.8).softmax(-1)) > ALPHA


def test_negative_control_wrong_temperature_is_caught() -> None:
    """The same test rejects draws made at 0.8 when 0.7 was asked for."""
    counts = _draw(LOGITS, 0.8)
    assert chi_square_pvalue(counts, (LOGITS.double() / 0.7).softmax(-1)) < ALPHA


def test_greedy_rows_are_the_exact_argmax_and_tiling_changes_nothing() -> None:
    g = torch.Generator().manual_seed(0)
    # bf16 with few distinct values: many ties, the first maximum must win (as argmax).
    logits = (torch.randn(12, 40, generator=g) * 2).round().to(torch.bfloat16)
    temperature = torch.tensor([0.0, 0.7, 0.0, 1.3] * 3)
    keys = torch.randint(-(2**62), 2**62, (12,), generator=g)
    positions = torch.randint(0, 5000, (12,), generator=g)
    # The interpreter's default, the GPU's (a row per program), and small tiles.
    configs = [None, gumbel_launch_config(40), SMALL_TILES]
    logits, temperature, keys, positions = (
        t.to(DEVICE) for t in (logits, temperature, keys, positions)
    )
    results = [gumbel_sample(logits, temperature, keys, positions, c)[0] for c in configs]
    greedy = temperature == 0
    assert torch.equal(results[0][greedy], logits.argmax(-1)[greedy])
    assert all(torch.equal(results[0], r) for r in results[1:])
    # A new position is new noise for the random rows.
    moved = gumbel_sample(logits, temperature, keys, positions + 1)[0]
    assert torch.equal(moved[greedy], results[0][greedy])
    assert not torch.equal(moved[~greedy], results[0][~greedy])


def test_batch_key_is_row_keys_counted_by_row_index() -> None:
    """One key for the batch draws exactly what per-row keys draw with every row's key
    that key (folded by ``batch_key``) and its row index as the position; and a new key
    is new noise."""
    g = torch.Generator().manual_seed(4)
    logits = torch.randn(6, 40, generator=g).to(DEVICE)
    temperature = torch.tensor([0.8, 0.0, 1.2, 0.5, 0.8, 2.0], device=DEVICE)
    key = 12345
    tokens, finite = gumbel_sample(logits, temperature, key, None, SMALL_TILES)
    keys = torch.full((6,), batch_key(key), dtype=torch.int64, device=DEVICE)
    rows = torch.arange(6, dtype=torch.int64, device=DEVICE)
    assert torch.equal(tokens, gumbel_sample(logits, temperature, keys, rows, SMALL_TILES)[0])
    assert finite.all() and tokens[1] == logits[1].argmax()
    # Each row its own noise: identical rows of one batch still draw independently.
    same = logits[:1].expand(4_000, -1)
    draws = gumbel_sample(same, torch.full((4_000,), 0.9, device=DEVICE), key, None)[0]
    counts = torch.bincount(draws.cpu(), minlength=40)
    assert chi_square_pvalue(counts, (logits[0].double().cpu() / 0.9).softmax(-1)) > ALPHA
    other = gumbel_sample(same, torch.full((4_000,), 0.9, device=DEVICE), key + 1, None)[0]
    assert not torch.equal(other, draws)
    with pytest.raises(ValueError, match="positions must be None"):
        gumbel_sample(logits, temperature, key, rows)


def test_batch_key_folds_into_one_kernel_type() -> None:
    for seed in (0, 1, 2**31 - 1, 2**31, 2**63 - 1, 2**63, 2**64 + 5, -7):
        assert 2**31 <= batch_key(seed) < 2**63


def test_nonfinite_rows_are_flagged_with_valid_ids() -> None:
    logits = torch.randn(5, 40, generator=torch.Generator().manual_seed(1))
    logits[1, 5] = float("nan")
    logits[2, 9] = float("inf")
    logits[3] = float("-inf")
    logits[4, :39] = float("-inf")  # one finite token: finite, and it is the draw
    tokens, finite = gumbel_sample(
        logits.to(DEVICE),
        torch.full((5,), 0.9, device=DEVICE),
        torch.arange(5, device=DEVICE),
        torch.zeros(5, dtype=torch.int64, device=DEVICE),
    )
    assert finite.tolist() == [True, False, False, False, True]
    assert ((tokens >= 0) & (tokens < 40)).all() and tokens[4] == 39


# Through the Sampler: the metadata decides which rows take the kernel.
VOCAB = 32


def _generator(seed: int) -> torch.Generator:
    return torch.Generator(device=DEVICE).manual_seed(seed)


def make_generators(requests) -> dict[str, torch.Generator]:
    return {r.request_id: _generator(r.sampling_params.seed) for r in requests
            if r.sampling_params.seed is not None}  # fmt: skip


def _run(logits: torch.Tensor, params: list[SamplingParams], row: int, steps: int = 12):
    """The tokens row ``row`` gets over ``steps`` steps (its output grows each step)."""
    requests = [make_request(i, p, [2, 3], []) for i, p in enumerate(params)]
    gens = make_generators(requests)
    sampler = Sampler(_generator(len(params)), use_gumbel_kernel=True)
    tokens = []
    for _ in range(steps):
        md = SamplingMetadata.from_requests(requests, DEVICE, gens, VOCAB)
        out = sampler(logits.to(DEVICE), md).sampled_token_ids.cpu()
        for r, t in zip(requests, out.tolist()):
            r.append_output_token_ids(t)
        tokens.append(out[row].item())
    return tokens


def test_seeded_row_independent_of_batch_kernel_and_fallback_rows() -> None:
    """A seeded temperature-only request draws the same tokens alone, in an all-kernel
    batch, and in a mixed batch where other rows need top-k or penalties."""
    g = torch.Generator().manual_seed(5)
    row = torch.randn(1, VOCAB, generator=g)
    noise = torch.randn(6, VOCAB, generator=g)
    seeded = SamplingParams(temperature=0.9, seed=1234)
    kernel_rows = [SamplingParams(temperature=0.5), SamplingParams(temperature=0.0),
                   SamplingParams(temperature=2.0, seed=7)]  # fmt: skip
    fallback_rows = [SamplingParams(temperature=1.0, top_k=4, seed=9),
                     SamplingParams(temperature=0.0, repetition_penalty=1.5),
                     SamplingParams(temperature=1.0, min_tokens=3, stop_token_ids=[5])]  # fmt: skip
    alone = _run(row, [seeded], 0)
    first = _run(torch.cat([row, noise[:3]]), [seeded, *kernel_rows], 0)
    mixed = _run(torch.cat([noise[3:], row]), [*fallback_rows, seeded], 3)
    assert alone == first == mixed
    assert len(set(alone)) > 1  # it really is sampling


def test_one_pass_rows_and_seeded_positions() -> None:
    params = [
        SamplingParams(temperature=0.7, seed=3),
        SamplingParams(temperature=0.0, top_k=3),  # greedy: filters do not apply
        SamplingParams(temperature=0.7, top_p=0.9),
        SamplingParams(temperature=0.0, presence_penalty=0.5),
        SamplingParams(temperature=1.0, min_tokens=2, stop_token_ids=[3]),
    ]
    requests = [make_request(i, p, [4, 5, 6], [7]) for i, p in enumerate(params)]
    gens = make_generators(requests)
    md = SamplingMetadata.from_requests(requests, torch.device("cpu"), gens, VOCAB)
    assert md.one_pass is not None
    assert md.one_pass.tolist() == [True, True, False, False, False]
    assert md.seeds == {0: (3, 4)}  # 3 prompt + 1 output: it samples position 4
    # With its latest token still in flight (async scheduling) it samples position 5,
    # the position a synchronous step sees once that token is appended.
    md = SamplingMetadata.from_requests(
        requests[:1], torch.device("cpu"), gens, VOCAB, in_flight_ids={"0"}
    )
    assert md.seeds == {0: (3, 5)} and md.one_pass.tolist() == [True]
    requests[4].append_output_token_ids(8)  # min_tokens reached: nothing masked now
    md = SamplingMetadata.from_requests(requests[4:], torch.device("cpu"), {}, VOCAB)
    assert md.one_pass.tolist() == [True]


def test_sampler_kernel_path_matches_distribution_and_flags() -> None:
    """The Sampler's kernel path (unseeded rows: keys from the engine generator) draws
    from softmax(logits / T), and reports finiteness as the general path does."""
    n = 4_000
    requests = [make_request(i, SamplingParams(temperature=0.7), [2], []) for i in range(n)]
    md = SamplingMetadata.from_requests(requests, DEVICE, {}, 8)
    sampler = Sampler(_generator(0), use_gumbel_kernel=True)
    logits = LOGITS.to(DEVICE).expand(n, 8)
    out = sampler(logits, md)
    assert out.logits_finite is not None and out.logits_finite.all()
    counts = torch.bincount(out.sampled_token_ids.cpu(), minlength=8)
    assert chi_square_pvalue(counts, (LOGITS.double() / 0.7).softmax(-1)) > ALPHA
    # Two steps draw different noise: fresh keys per step.
    again = sampler(logits, md).sampled_token_ids
    assert not torch.equal(again, out.sampled_token_ids)


def _count_kernel_calls(runner, on: bool | None) -> None:
    """Switch the engine's kernel on (or back to its default) and count its calls."""
    sampler = runner.sampler
    sampler.use_gumbel_kernel = on
    sampler.kernel_calls = 0
    if "gumbel_sample" not in vars(sampler):
        plain = sampler.gumbel_sample

        def counted(*args, **kwargs):
            sampler.kernel_calls += 1
            return plain(*args, **kwargs)

        sampler.gumbel_sample = counted


@pytest.mark.skipif(not INTERPRETED, reason="the shared test LLM runs on the CPU")
def test_engine_seeded_request_alone_batched_and_synchronous(llm) -> None:
    """Through the engine with the kernel on: a seeded temperature-only request gets the
    same tokens alone, in a batch beside greedy, top-k, penalty and unseeded requests,
    and with async scheduling off (its position counts the token in flight)."""
    llm.collective_rpc(_count_kernel_calls, args=(True,))
    core = llm.llm_engine.engine_core.engine_core
    was_async = core.async_scheduling
    try:
        seeded = SamplingParams(temperature=0.8, seed=42, max_tokens=12, ignore_eos=True)
        others = [
            SamplingParams(temperature=0.0, max_tokens=9, ignore_eos=True),
            SamplingParams(temperature=1.0, top_k=5, seed=3, max_tokens=14, ignore_eos=True),
            SamplingParams(temperature=0.9, repetition_penalty=1.3, max_tokens=5),
            SamplingParams(temperature=0.7, max_tokens=12, ignore_eos=True),
        ]
        prompts = ["the cat", "hello world", "a b c d e f", "q", "one two three"]

        def tokens(prompt_list, params):
            outs = llm.generate(prompt_list, params, use_tqdm=False)
            return [list(o.outputs[0].token_ids) for o in outs]

        alone = tokens(["hello world"], seeded)[0]
        batched = tokens(prompts, [others[0], seeded, *others[1:]])[1]
        core.async_scheduling = not was_async
        other_mode = tokens(prompts[1:3], [seeded, others[1]])[0]
        assert alone == batched == other_mode
        assert len(set(alone)) > 1  # it really is sampling
        assert llm.collective_rpc(lambda runner: runner.sampler.kernel_calls)[0] > 0
    finally:
        core.async_scheduling = was_async
        llm.collective_rpc(_count_kernel_calls, args=(None,))


def test_one_launch_keeps_its_workspace_and_leaves_the_counters_at_zero() -> None:
    # The row block's last program picks the best slice, counted on a per-block counter
    # it resets: a second call, on the workspace the engine reserved, finds it clean.
    from minivllm.sample import gumbel

    gumbel.reserve_workspace(DEVICE, 6, 40)
    logits = torch.randn(6, 40, generator=torch.Generator().manual_seed(3)).to(DEVICE)
    reserved = gumbel._workspaces[logits.device]  # the reservation, whatever DEVICE's name
    temperature = torch.tensor([0.7, 0.0, 1.3, 0.7, 0.0, 2.0], device=DEVICE)
    first = gumbel_sample(logits, temperature, 123, None)
    second = gumbel_sample(logits, temperature, 123, None)
    assert gumbel._workspaces[logits.device] is reserved  # nothing allocated but the results
    assert (reserved[3] == 0).all()
    assert torch.equal(first[0], second[0]) and torch.equal(first[1], second[1])
    # The greedy rows took their argmax.
    assert first[0][1] == logits[1].argmax() and first[0][4] == logits[4].argmax()
