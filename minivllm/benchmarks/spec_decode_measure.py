"""``minivllm bench spec``'s measurements: batch 1, throughput, the batch-size sweep and
the greedy-identity margins (``spec_decode`` runs them on each engine and compares).

Batch 1 steps the engine through one request at a time and times everything after the
first token; throughput times the whole workload, as ``bench throughput`` does. Both
read the acceptance statistics of exactly the timed runs (the engine's totals after
minus before).

The sweep answers "up to which batch size does speculation pay?": the same requests
(the throughput workload's first ``B`` prompts, cut to one length, each generating the
same number of tokens with EOS ignored, so the batch stays ``B`` until the end) run at
``B`` = 1, 4, 16, ... with speculation off, on, and on with ``disable_by_batch_size``,
one engine per setting, side by side in one process. ``crossover`` reads the largest
swept ``B`` at which speculation was still at least as fast as off: the threshold the
bench then sets (``SpeculativeConfig.disable_by_batch_size``) for its batch-256 run.

The margins answer "is a greedy difference between speculation on and off a bug or
float noise?": the batch-1 prompts run once more with ``logprobs=2``, and for every
sequence that differs from off, ``compare_greedy`` records the first divergent position
and both runs' top-2 logprobs there. A verification step computes ``1 + k`` rows per
request where a decode step computes one, and GEMM kernels choose their tiling by the
number of rows, so in bf16 the logits of the same position can differ in the last bits;
that flips the argmax only where the top two are (nearly) tied.
"""

from __future__ import annotations

import time
from typing import Any

from minivllm.benchmarks.common import compare_greedy, cuda_sync, top2
from minivllm.benchmarks.workloads import Workload


def _one_request(llm, prompt: list[int], output_len: int) -> tuple[float, int, list[int]]:
    """Step the engine through one greedy request: (seconds after the first token, steps
    after it, the output token ids)."""
    from minivllm import SamplingParams

    engine = llm.llm_engine
    engine.reset_prefix_cache()  # a repeat must not hit the last run
    engine.add_request(
        {"prompt_token_ids": prompt},
        SamplingParams(temperature=0.0, max_tokens=output_len, ignore_eos=True),
    )
    cuda_sync()
    outputs: list = []
    # Until the first token, or the end: a request that fails (non-finite logits) ends
    # with no token at all, and waiting for one would wait forever.
    while engine.has_unfinished_requests() and not any(o.outputs[0].token_ids for o in outputs):
        outputs = engine.step() or outputs
    first = time.perf_counter()
    steps = 0
    while engine.has_unfinished_requests():
        outputs = engine.step() or outputs
        steps += 1
    cuda_sync()
    _check_finished(outputs)
    return time.perf_counter() - first, steps, list(outputs[-1].outputs[0].token_ids)


def _check_finished(outputs: list) -> None:
    """Refuse to time requests the engine failed: their figures would mean nothing.

    Raises:
        RuntimeError: A request finished with ``finish_reason="error"`` (its reason, e.g.
            non-finite logits from a broken checkpoint, is quoted).
    """
    failed = [o for o in outputs if o.outputs[0].finish_reason == "error"]
    if failed:
        raise RuntimeError(
            f"bench spec: {len(failed)} request(s) failed in the engine, so nothing is "
            f"timed; the first: {failed[0].outputs[0].stop_reason}"
        )


def _spec_delta(before: Any, after: Any) -> dict[str, Any]:
    """The acceptance statistics of the timed runs: the engine's totals after minus before."""
    if after is None:
        return {}
    drafts = after.num_drafts - (before.num_drafts if before else 0)
    drafted = after.num_draft_tokens - (before.num_draft_tokens if before else 0)
    accepted = after.num_accepted_tokens - (before.num_accepted_tokens if before else 0)
    per_pos = [
        a - (before.num_accepted_tokens_per_pos[i] if before else 0)
        for i, a in enumerate(after.num_accepted_tokens_per_pos)
    ]
    return {
        "num_drafts": drafts,
        "num_draft_tokens": drafted,
        "num_accepted_tokens": accepted,
        "acceptance_rate": accepted / drafted if drafted else None,
        "acceptance_rate_per_pos": [n / drafts for n in per_pos] if drafts else None,
        "mean_acceptance_length": 1 + accepted / drafts if drafts else None,
    }


def measure_batch1(llm, prompts: list[list[int]], output_len: int) -> dict[str, Any]:
    """Time per output token over the prompts run one at a time (after a warm-up)."""
    _one_request(llm, prompts[0], min(output_len, 32))  # warm-up: compile, capture
    before = llm.llm_engine.stats.spec_decoding_stats
    seconds, steps, outputs = 0.0, 0, []
    for prompt in prompts:
        s, n, tokens = _one_request(llm, prompt, output_len)
        seconds, steps = seconds + s, steps + n
        outputs.append(tokens)
    after_first = sum(len(t) - 1 for t in outputs)  # tokens timed: all but each first
    entry = {
        "seconds": seconds,
        "output_tokens": sum(map(len, outputs)),
        "tpot_ms": 1e3 * seconds / after_first,
        "steps": steps,
        "tokens_per_step": after_first / steps if steps else None,
        **_spec_delta(before, llm.llm_engine.stats.spec_decoding_stats),
    }
    return {"entry": entry, "outputs": outputs}


def measure_throughput(llm, workload: Workload) -> dict[str, Any]:
    """Output tokens per second on the workload, greedy.

    A warm-up first runs every prompt for at most 32 tokens: the batch shapes of the
    prefills and of the full-batch decode and verification steps get their kernels
    compiled and graphs used, at an eighth of a full run's cost.
    """
    from minivllm import SamplingParams

    prompts = [{"prompt_token_ids": p} for p in workload.prompts]
    warm = [
        SamplingParams(temperature=0.0, max_tokens=min(n, 32), ignore_eos=True)
        for n in workload.output_lens
    ]
    _check_finished(llm.generate(prompts, warm, use_tqdm=False))
    params = [
        SamplingParams(temperature=0.0, max_tokens=n, ignore_eos=True) for n in workload.output_lens
    ]
    llm.reset_prefix_cache()
    before = llm.llm_engine.stats.spec_decoding_stats
    cuda_sync()
    start = time.perf_counter()
    outputs = llm.generate(prompts, params, use_tqdm=False)
    cuda_sync()
    seconds = time.perf_counter() - start
    _check_finished(outputs)
    tokens = [list(o.outputs[0].token_ids) for o in outputs]
    entry = {
        "seconds": seconds,
        "output_tokens": sum(map(len, tokens)),
        "output_tokens_per_s": sum(map(len, tokens)) / seconds,
        **_spec_delta(before, llm.llm_engine.stats.spec_decoding_stats),
    }
    return {"entry": entry, "outputs": tokens}


def sweep_prompts(prompts: list[list[int]], batch_sizes: list[int], length: int) -> list[list[int]]:
    """The sweep's prompts: the first ``max(batch_sizes)`` prompts, each cut to at most
    ``length`` tokens (a prompt shorter than that is kept whole)."""
    count = max(batch_sizes)
    if len(prompts) < count:
        raise ValueError(
            f"--sweep-batch-sizes {count} needs {count} prompts, but --num-requests gives "
            f"{len(prompts)}"
        )
    return [p[:length] for p in prompts[:count]]


def _greedy_batch(llm, prompts: list[list[int]], output_len: int, logprobs: int | None = None):
    from minivllm import SamplingParams

    params = SamplingParams(
        temperature=0.0, max_tokens=output_len, ignore_eos=True, logprobs=logprobs
    )
    inputs = [{"prompt_token_ids": p} for p in prompts]
    return llm.generate(inputs, [params] * len(prompts), use_tqdm=False)


def measure_sweep(
    llm, prompts: list[list[int]], batch_sizes: list[int], output_len: int
) -> list[dict[str, Any]]:
    """Output tokens per second at each batch size (all ``B`` requests submitted at
    once, wall time from submission to the last token, after a warm-up of the same
    requests for up to 32 tokens), with the drafts proposed and accepted in the timed run."""
    entries = []
    for b in batch_sizes:
        batch = prompts[:b]
        _greedy_batch(llm, batch, min(output_len, 32))  # warm-up: this batch's shapes
        llm.reset_prefix_cache()  # the timed run prefills again
        before = llm.llm_engine.stats.spec_decoding_stats
        drafted0, accepted0 = _draft_counts(before)
        cuda_sync()
        start = time.perf_counter()
        outputs = _greedy_batch(llm, batch, output_len)
        cuda_sync()
        seconds = time.perf_counter() - start
        _check_finished(outputs)
        drafted1, accepted1 = _draft_counts(llm.llm_engine.stats.spec_decoding_stats)
        tokens = sum(len(o.outputs[0].token_ids) for o in outputs)
        entries.append(
            {
                "batch_size": b,
                "seconds": seconds,
                "output_tokens": tokens,
                "output_tokens_per_s": tokens / seconds,
                "num_draft_tokens": drafted1 - drafted0,
                "num_accepted_tokens": accepted1 - accepted0,
                "outputs": [list(o.outputs[0].token_ids) for o in outputs],
            }
        )
        print(
            f"  sweep batch {b}: {tokens / seconds:.0f} output tok/s, "
            f"{drafted1 - drafted0} drafts proposed, {accepted1 - accepted0} accepted",
            flush=True,
        )
    return entries


def _draft_counts(stats: Any) -> tuple[int, int]:
    if stats is None:
        return 0, 0
    return stats.num_draft_tokens, stats.num_accepted_tokens


def compare_sweeps(off: list[dict], others: dict[str, list[dict]]) -> list[dict[str, Any]]:
    """One row per batch size: each setting's tokens/s and its ratio to off, and how
    many of its greedy sequences equal off's. The token lists are dropped here."""
    rows = []
    for i, ref in enumerate(off):
        row: dict[str, Any] = {
            "batch_size": ref["batch_size"],
            "off": _without_outputs(ref),
        }
        for name, entries in others.items():
            entry = entries[i]
            row[name] = {
                **_without_outputs(entry),
                "ratio_over_off": entry["output_tokens_per_s"] / ref["output_tokens_per_s"],
                "identical_to_off": sum(
                    a == b for a, b in zip(entry["outputs"], ref["outputs"], strict=True)
                ),
            }
        rows.append(row)
    return rows


def _without_outputs(entry: dict[str, Any]) -> dict[str, Any]:
    return {k: v for k, v in entry.items() if k != "outputs"}


def crossover(rows: list[dict[str, Any]], name: str = "ngram") -> int | None:
    """The largest swept batch size up to which speculation (``rows[i][name]``) was at
    least as fast as off at every swept size; None if it was slower already at the
    smallest. Between that size and the next swept one the crossing is not located."""
    best = None
    for row in sorted(rows, key=lambda r: r["batch_size"]):
        if row[name]["ratio_over_off"] < 1.0:
            break
        best = row["batch_size"]
    return best


def margin_run(llm, prompts: list[list[int]], output_len: int) -> list:
    """The prompts one at a time (batch 1), greedy, with the top-2 logprobs of every
    token: the completions ``compare_greedy`` reads. Each starts from an empty prefix
    cache, so every setting prefills the whole prompt in the same steps."""
    completions = []
    for prompt in prompts:
        llm.reset_prefix_cache()
        completions.append(_greedy_batch(llm, [prompt], output_len, logprobs=2)[0].outputs[0])
    return completions


def margins(reference: list, completions: list) -> dict[str, Any]:
    """``compare_greedy`` of speculation off (``reference``) and on, as plain JSON."""
    result = compare_greedy(reference, completions, ("off", "on"))
    for d in result["divergences"]:
        for key in ("off_top2", "on_top2"):
            d[key] = [list(pair) for pair in d[key]]
    return result


def gap_quantiles(completions: list) -> dict[str, Any]:
    """The top-2 logprob gap at every generated position of ``completions``: how many,
    the smallest, the 10th percentile and the median. A divergence whose gap is far
    below the median happened at one of the rare near-ties."""
    gaps = sorted(a[1] - b[1] for c in completions for a, b in map(top2, c.logprobs))
    if not gaps:
        return {"num_positions": 0, "min": None, "p10": None, "median": None}
    return {
        "num_positions": len(gaps),
        "min": gaps[0],
        "p10": gaps[len(gaps) // 10],
        "median": gaps[len(gaps) // 2],
    }
