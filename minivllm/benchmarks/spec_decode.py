"""``minivllm bench spec``: speculative decoding off vs on, side by side in one run.

Three measurements, each against the engine without speculation on the same requests:

1. batch 1 on a workload that repeats itself (prompts that quote a passage twice and
   ask for it again): time per output token with no speculation and with n-gram drafts
   for each ``k`` of ``--ks``, the tokens a step emits, and the engine's own acceptance
   statistics (rate per draft position, mean acceptance length);
2. the same with a draft model (``--draft-model PATH``), when this minivllm has that
   proposer; otherwise the part is skipped and the JSON says why;
3. the throughput workload of ``bench throughput`` at batch 256, off vs n-gram at
   ``--throughput-k``: output tokens per second and their ratio.

Greedy outputs with speculation are compared token for token with the outputs without
it; the JSON counts the identical requests (speculation is lossless, so all of them,
up to the float noise of a different batch shape). Upstream's counterpart is
``vllm bench`` with ``--speculative-config`` run once per setting
(``vllm/benchmarks/``); here the settings run in one process, one engine at a time,
so the ratios come from one machine state.
"""

from __future__ import annotations

import argparse
import gc
import json
import time
from pathlib import Path
from typing import Any

from minivllm.benchmarks.common import cuda_sync, default_output, environment, write_json
from minivllm.benchmarks.throughput import add_engine_bench_args, build_llm, checkpoint_path
from minivllm.benchmarks.workloads import Workload, repetitive_prompts, throughput_workload


def add_spec_args(parser: argparse.ArgumentParser) -> None:
    """Register the options of ``minivllm bench spec``."""
    add_engine_bench_args(parser, default_output("spec_decode.json"))
    parser.add_argument(
        "--ks",
        type=int,
        nargs="+",
        default=[1, 2, 3, 4, 5],
        help="num_speculative_tokens values to measure at batch 1",
    )
    parser.add_argument(
        "--num-prompts", type=int, default=4, help="repetitive prompts, run one at a time (batch 1)"
    )
    parser.add_argument(
        "--output-len",
        type=int,
        default=256,
        help="tokens generated per batch-1 prompt (EOS ignored)",
    )
    parser.add_argument("--prompt-lookup-min", type=int, default=2)
    parser.add_argument("--prompt-lookup-max", type=int, default=4)
    parser.add_argument(
        "--draft-model",
        default=None,
        help="also measure the draft-model proposer with this checkpoint",
    )
    parser.add_argument(
        "--draft-ks",
        type=int,
        nargs="+",
        default=None,
        help="k values for the draft model (default: --ks)",
    )
    parser.add_argument(
        "--throughput-k",
        type=int,
        default=None,
        help="n-gram k for the batch-256 run (default: the largest of --ks)",
    )
    parser.add_argument(
        "--num-requests",
        type=int,
        default=256,
        help="requests of the throughput workload (0: skip that part)",
    )
    parser.add_argument("--input-len-range", type=int, nargs=2, default=[100, 1024])
    parser.add_argument("--output-len-range", type=int, nargs=2, default=[100, 1024])
    parser.add_argument(
        "--no-plot",
        action="store_true",
        help="write the JSON only (the plot: python -m "
        "minivllm.benchmarks.spec_decode_plot FILE.json)",
    )


def _check_args(args: argparse.Namespace) -> None:
    for name in ("ks", "draft_ks"):
        values = getattr(args, name)
        if values is not None and (not values or min(values) < 1):
            raise ValueError(f"--{name.replace('_', '-')} must be positive integers, got {values}")
    for name in ("num_prompts", "output_len"):
        if getattr(args, name) < 1:
            raise ValueError(f"--{name.replace('_', '-')} must be >= 1")
    if args.num_requests < 0:
        raise ValueError("--num-requests must be >= 0")
    if args.throughput_k is not None and args.throughput_k < 1:
        raise ValueError("--throughput-k must be >= 1")
    if args.draft_model is not None and not (Path(args.draft_model) / "config.json").is_file():
        raise FileNotFoundError(f"--draft-model {args.draft_model}: no config.json there")


def draft_model_unavailable() -> str | None:
    """Why the draft-model proposer cannot run here (None: it can)."""
    from minivllm.config import SpeculativeConfig

    if "draft_model" not in getattr(SpeculativeConfig, "METHODS", ()):
        return (
            "this minivllm has no draft-model proposer (SpeculativeConfig.METHODS "
            f"is {list(SpeculativeConfig.METHODS)})"
        )
    return None


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


def _spec_config(method: str, k: int, args: argparse.Namespace) -> dict[str, Any] | None:
    if method == "off":
        return None
    if method == "ngram":
        return {
            "method": "ngram",
            "num_speculative_tokens": k,
            "prompt_lookup_min": args.prompt_lookup_min,
            "prompt_lookup_max": args.prompt_lookup_max,
        }
    return {"method": "draft_model", "model": args.draft_model, "num_speculative_tokens": k}


def _write_atomically(path: Path, result: dict[str, Any]) -> None:
    """Write the JSON beside ``path`` and move it there: a run stopped by a timeout while
    writing leaves the previous complete file, never half of one."""
    tmp = path.with_name(path.name + ".tmp")
    write_json(tmp, result)
    tmp.replace(path)


def _free_device_memory() -> None:
    """Return the last engine's memory, so the next one's KV pool is sized as alone."""
    import torch

    gc.collect()
    if torch.cuda.is_available():
        torch.cuda.empty_cache()


def _identical(a: list[list[int]], b: list[list[int]]) -> int:
    return sum(x == y for x, y in zip(a, b, strict=True))


def _first_differences(a: list[list[int]], b: list[list[int]]) -> list[int | None]:
    """Per request, the index of the first token where ``a`` and ``b`` differ (None:
    identical): a late first difference points at float noise of the batch shape, a
    difference at token 0 at a bug."""
    return [
        next((i for i, (x, y) in enumerate(zip(ra, rb)) if x != y), None) if ra != rb else None
        for ra, rb in zip(a, b, strict=True)
    ]


def run_spec_bench(args: argparse.Namespace) -> dict[str, Any]:
    """Run every setting, write the JSON (and the plot) and return the result."""
    _check_args(args)
    bench = SpecBench(args)
    for method, k in bench.settings():
        if method == "draft_model":
            # The draft model runs last: a failure there is recorded, the rest is kept.
            try:
                bench.run_setting(method, k)
            except Exception as exc:  # noqa: BLE001 (reported in the JSON and printed)
                bench.result["batch1"]["draft_model"][str(k)] = {"k": k, "error": repr(exc)}
                print(f"bench spec: draft model k={k} failed: {exc!r}", flush=True)
        else:
            bench.run_setting(method, k)
        _free_device_memory()
        _write_atomically(Path(args.output), bench.result)  # a stopped run keeps what ran
    if not args.no_plot:
        from minivllm.benchmarks.spec_decode_plot import plot_spec_results

        plot_spec_results(bench.result, Path(args.output).with_suffix(".png"))
    return bench.result


class SpecBench:
    """The settings of one ``bench spec`` run and what they measured so far.

    Speculation off runs first: its outputs are the reference every other setting is
    compared with, token for token.
    """

    def __init__(self, args: argparse.Namespace) -> None:
        self.args = args
        self.path = checkpoint_path(args)
        self.vocab_size = json.loads((Path(self.path) / "config.json").read_text())["vocab_size"]
        self.throughput_k = args.throughput_k or max(args.ks)
        self.workload = throughput_workload(
            args.num_requests, 0, tuple(args.input_len_range), tuple(args.output_len_range)
        )
        # The published workload draws ids below 10000; a smaller vocabulary wraps them.
        self.workload.prompts = [[t % self.vocab_size for t in p] for p in self.workload.prompts]
        self.prompts: list[list[int]] = []
        self.reference: list[list[int]] = []
        self.throughput_reference: list[list[int]] = []
        self.draft_skipped = None if args.draft_model is None else draft_model_unavailable()
        self.result: dict[str, Any] = {
            **environment(),
            "model": self.path,
            "draft_model": args.draft_model,
            "cuda_graphs": not args.enforce_eager,
            "prompt_lookup": [args.prompt_lookup_min, args.prompt_lookup_max],
            "workload": None,
            "batch1": {"off": None, "ngram": {}, "draft_model": {}},
            "throughput": None,
        }
        if self.draft_skipped is not None:
            self.result["batch1"]["draft_model"] = {"skipped": self.draft_skipped}
            print(f"bench spec: draft model skipped: {self.draft_skipped}", flush=True)

    def settings(self) -> list[tuple[str, int]]:
        """(method, k) in run order: off, n-gram (the throughput k last: its batch-256
        run is the longest, and a run stopped there keeps every batch-1 figure), then
        the draft model."""
        args = self.args
        ks = [k for k in args.ks if not (args.num_requests and k == self.throughput_k)]
        settings = [("off", 0)] + [("ngram", k) for k in ks]
        if args.num_requests:
            settings.append(("ngram", self.throughput_k))
        if args.draft_model is not None and self.draft_skipped is None:
            settings += [("draft_model", k) for k in args.draft_ks or args.ks]
        return settings

    def run_setting(self, method: str, k: int) -> None:
        """Build one engine, measure what it takes part in, release it."""
        args = self.args
        in_throughput = args.num_requests > 0 and (method, k) in (
            ("off", 0),
            ("ngram", self.throughput_k),
        )
        llm = build_llm(
            args,
            self.path,
            speculative_config=_spec_config(method, k, args),
            max_num_seqs=args.max_num_seqs if in_throughput else min(args.max_num_seqs, 8),
        )
        try:
            async_scheduling = llm.llm_engine.engine_core.engine_core.async_scheduling
            if method == "off":
                tokenizer = llm.get_tokenizer()
                self.prompts = repetitive_prompts(tokenizer, args.num_prompts, self.vocab_size)
                self.result["workload"] = {
                    "num_prompts": args.num_prompts,
                    "text": tokenizer is not None,
                    "prompt_tokens": [len(p) for p in self.prompts],
                    "output_len": args.output_len,
                }
            if method != "ngram" or k in args.ks:
                self._batch1(llm, method, k, async_scheduling)
            if in_throughput:
                self._throughput(llm, method, k, async_scheduling)
        finally:
            llm.shutdown()

    def _batch1(self, llm, method: str, k: int, async_scheduling: bool) -> None:
        run = measure_batch1(llm, self.prompts, self.args.output_len)
        entry = {"k": k, "async_scheduling": async_scheduling, **run["entry"]}
        batch1 = self.result["batch1"]
        if method == "off":
            self.reference = run["outputs"]
            batch1["off"] = entry
        else:
            entry["speedup_tpot"] = batch1["off"]["tpot_ms"] / entry["tpot_ms"]
            batch1[method][str(k)] = entry
            batch1[method] = dict(sorted(batch1[method].items(), key=lambda kv: int(kv[0])))
        entry["identical_to_off"] = _identical(run["outputs"], self.reference)
        entry["first_difference"] = _first_differences(run["outputs"], self.reference)
        _print_batch1(method, entry)

    def _throughput(self, llm, method: str, k: int, async_scheduling: bool) -> None:
        run = measure_throughput(llm, self.workload)
        entry = {"k": k, "async_scheduling": async_scheduling, **run["entry"]}
        print(
            f"batch {len(self.workload.prompts)} {method} k={k}: "
            f"{entry['output_tokens_per_s']:.0f} output tok/s",
            flush=True,
        )
        if method == "off":
            self.throughput_reference = run["outputs"]
            self.result["throughput"] = {
                "num_requests": len(self.workload.prompts),
                "prompt_tokens": self.workload.num_prompt_tokens,
                "off": entry,
            }
            return
        t = self.result["throughput"]
        t["ngram"] = entry
        t["ratio_on_over_off"] = entry["output_tokens_per_s"] / t["off"]["output_tokens_per_s"]
        t["identical_requests"] = _identical(run["outputs"], self.throughput_reference)
        print(
            f"throughput with n-gram k={k} / off: {t['ratio_on_over_off']:.3f}, "
            f"{t['identical_requests']} of {t['num_requests']} identical",
            flush=True,
        )


def _print_batch1(method: str, entry: dict[str, Any]) -> None:
    line = f"batch 1 {method} k={entry['k']}: {entry['tpot_ms']:.3f} ms per output token"
    if "speedup_tpot" in entry:
        mean = entry.get("mean_acceptance_length")
        line += f" ({entry['speedup_tpot']:.2f}x), mean acceptance length " + (
            "-" if mean is None else f"{mean:.2f}"
        )
    print(line + f", {entry['identical_to_off']} identical to off", flush=True)
