"""``minivllm bench spec``: speculative decoding off vs on, side by side in one run.

Three measurements, each against the engine without speculation on the same requests:

1. batch 1 on a workload that repeats itself (prompts that quote a passage twice and
   ask for it again), or with ``--prompt-file`` on held-out continuations (prompts cut
   from the validation passages of a ``demo.train`` data file, see
   ``heldout_prompts``): time per output token with no speculation and with n-gram drafts
   for each ``k`` of ``--ks``, the tokens a step emits, and the engine's own acceptance
   statistics (rate per draft position, mean acceptance length);
2. the same with a draft model (``--draft-model PATH``), when this minivllm has that
   proposer; otherwise the part is skipped and the JSON says why;
3. a batch-size sweep (``--sweep-batch-sizes``, see ``spec_decode_measure``): off, n-gram
   at ``--throughput-k``, and n-gram with ``disable_by_batch_size`` on the same
   requests at each batch size; the largest size where speculation still paid is the
   threshold (unless ``--disable-by-batch-size`` names one);
4. the throughput workload of ``bench throughput`` at batch 256, off vs n-gram at
   ``--throughput-k`` without and with that threshold: output tokens per second and
   their ratios.

Greedy outputs with speculation are compared token for token with the outputs without
it; the JSON counts the identical requests (speculation is lossless, so all of them,
up to the float noise of a different batch shape), and for the batch-1 prompts it
records, at each first divergence, both runs' top-2 logprobs: their gap says whether
the divergence was a near-tie (float noise) or an error. Upstream's counterpart is
``vllm bench`` with ``--speculative-config`` run once per setting
(``vllm/benchmarks/``); here the settings run in one process, one engine at a time,
so the ratios come from one machine state.
"""

from __future__ import annotations

import argparse
import json
from pathlib import Path
from typing import Any

from minivllm.benchmarks import spec_decode_measure as measure
from minivllm.benchmarks.common import (
    environment,
    first_divergence,
    free_device_memory,
    write_json,
)
from minivllm.benchmarks.spec_decode_args import check_spec_args
from minivllm.benchmarks.throughput import build_llm, checkpoint_path
from minivllm.benchmarks.workloads import (
    heldout_prompts,
    repetitive_prompts,
    throughput_workload,
)


def draft_model_unavailable() -> str | None:
    """Why the draft-model proposer cannot run here (None: it can)."""
    from minivllm.config import SpeculativeConfig

    if "draft_model" not in getattr(SpeculativeConfig, "METHODS", ()):
        return (
            "this minivllm has no draft-model proposer (SpeculativeConfig.METHODS "
            f"is {list(SpeculativeConfig.METHODS)})"
        )
    return None


def _spec_config(
    method: str, k: int, args: argparse.Namespace, threshold: int | None = None
) -> dict[str, Any] | None:
    if method in ("off", "off_again"):
        return None
    if method in ("ngram", "ngram_threshold"):
        config = {
            "method": "ngram",
            "num_speculative_tokens": k,
            "prompt_lookup_min": args.prompt_lookup_min,
            "prompt_lookup_max": args.prompt_lookup_max,
        }
        if method == "ngram_threshold":
            config["disable_by_batch_size"] = threshold
        return config
    return {"method": "draft_model", "model": args.draft_model, "num_speculative_tokens": k}


def _write_atomically(path: Path, result: dict[str, Any]) -> None:
    """Write the JSON beside ``path`` and move it there: a run stopped by a timeout while
    writing leaves the previous complete file, never half of one."""
    tmp = path.with_name(path.name + ".tmp")
    write_json(tmp, result)
    tmp.replace(path)


def _identical(a: list[list[int]], b: list[list[int]]) -> int:
    return sum(x == y for x, y in zip(a, b, strict=True))


def _first_differences(a: list[list[int]], b: list[list[int]]) -> list[int | None]:
    """Per request, the index of the first token where ``a`` and ``b`` differ (None:
    identical): a late first difference points at float noise of the batch shape, a
    difference at token 0 at a bug."""
    return [first_divergence(ra, rb) for ra, rb in zip(a, b, strict=True)]


def run_spec_bench(args: argparse.Namespace) -> dict[str, Any]:
    """Run every setting, write the JSON (and the plot) and return the result."""
    check_spec_args(args)
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
        free_device_memory()
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
        self.batch_sizes = sorted(set(args.sweep_batch_sizes or []))
        self.sweep_prompts = (
            measure.sweep_prompts(self.workload.prompts, self.batch_sizes, args.sweep_prompt_len)
            if self.batch_sizes
            else []
        )
        self.sweeps: dict[str, list[dict[str, Any]]] = {}  # setting -> entries with outputs
        self.threshold = args.disable_by_batch_size
        self.prompts: list[list[int]] = []
        self.reference: list[list[int]] = []
        self.margin_reference: list = []
        self.throughput_reference: list[list[int]] = []
        self.draft_skipped = None if args.draft_model is None else draft_model_unavailable()
        # Cut before any engine is built: a bad file or too few passages fails at once.
        self.heldout = None if args.prompt_file is None else self._heldout_prompts()
        self.result: dict[str, Any] = {
            **environment(),
            "model": self.path,
            "draft_model": args.draft_model,
            "cuda_graphs": not args.enforce_eager,
            "prompt_lookup": [args.prompt_lookup_min, args.prompt_lookup_max],
            "workload": None,
            "batch1": {"off": None, "ngram": {}, "draft_model": {}},
            "identity": None,
            "sweep": None,
            "throughput": None,
        }
        if self.draft_skipped is not None:
            self.result["batch1"]["draft_model"] = {"skipped": self.draft_skipped}
            print(f"bench spec: draft model skipped: {self.draft_skipped}", flush=True)

    @property
    def large(self) -> bool:
        """Whether the settings with many requests at once (sweep, batch 256) run."""
        return self.args.num_requests > 0

    @property
    def thresholded(self) -> bool:
        """Whether the n-gram run with ``disable_by_batch_size`` runs: it needs a
        threshold, given or found by the sweep."""
        return self.large and bool(self.batch_sizes or self.threshold is not None)

    def settings(self) -> list[tuple[str, int]]:
        """(method, k) in run order: off, n-gram at the throughput k (sweep, batch 256),
        n-gram with the threshold the sweep found, the other n-gram ks (batch 1 only),
        then the draft model. A run stopped by a timeout keeps what ran first."""
        args = self.args
        settings = [("off", 0)]
        if self.large:
            settings.append(("ngram", self.throughput_k))
        if self.thresholded:
            settings.append(("ngram_threshold", self.throughput_k))
        if self.large and self.batch_sizes and args.repeat_off:
            settings.append(("off_again", 0))
        settings += [("ngram", k) for k in args.ks if not (self.large and k == self.throughput_k)]
        if args.draft_model is not None and self.draft_skipped is None:
            settings += [("draft_model", k) for k in args.draft_ks or args.ks]
        return settings

    def run_setting(self, method: str, k: int) -> None:
        """Build one engine, measure what it takes part in, release it."""
        args = self.args
        large = self.large and (method, k) in (
            ("off", 0),
            ("ngram", self.throughput_k),
            ("ngram_threshold", self.throughput_k),
            ("off_again", 0),
        )
        if method == "ngram_threshold" and self.threshold is None:
            self.threshold = measure.crossover(self.result["sweep"]["rows"]) or 1
            self.result["sweep"]["threshold_from_sweep"] = True
        llm = build_llm(
            args,
            self.path,
            speculative_config=_spec_config(method, k, args, self.threshold),
            max_num_seqs=args.max_num_seqs if large else min(args.max_num_seqs, 8),
        )
        try:
            async_scheduling = llm.llm_engine.engine_core.engine_core.async_scheduling
            if method == "off":
                self._batch1_workload(llm)
            if method in ("off", "draft_model") or (method == "ngram" and k in args.ks):
                self._batch1(llm, method, k, async_scheduling)
            if large and self.batch_sizes:
                self._sweep(llm, method, k)
            if large and method != "off_again" and not args.no_throughput:
                self._throughput(llm, method, k, async_scheduling)
        finally:
            llm.shutdown()

    def _heldout_prompts(self) -> dict[str, Any]:
        """The held-out workload: prompts and the record of how they were cut."""
        from minivllm.engine.llm_engine import load_tokenizer

        tokenizer = load_tokenizer(self.path)
        if tokenizer is None:
            raise ValueError(f"--prompt-file needs a tokenizer in --model {self.path}")
        return heldout_prompts(
            tokenizer,
            self.args.prompt_file,
            self.args.num_prompts,
            self.args.prompt_val_every,
            self.args.prompt_tokens,
        )

    def _batch1_workload(self, llm) -> None:
        """Set the batch-1 prompts and record which workload they are."""
        args = self.args
        if self.heldout is not None:
            self.prompts = self.heldout.pop("prompts")
            workload = {"kind": "heldout_continuation", "text": True, **self.heldout}
        else:
            tokenizer = llm.get_tokenizer()
            self.prompts = repetitive_prompts(tokenizer, args.num_prompts, self.vocab_size)
            workload = {"kind": "repetitive", "text": tokenizer is not None}
        self.result["workload"] = {
            **workload,
            "num_prompts": args.num_prompts,
            "prompt_tokens": [len(p) for p in self.prompts],
            "output_len": args.output_len,
        }

    def _batch1(self, llm, method: str, k: int, async_scheduling: bool) -> None:
        run = measure.measure_batch1(llm, self.prompts, self.args.output_len)
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
        if self.args.margin_prompts:
            self._margins(llm, method, k, entry)

    def _margins(self, llm, method: str, k: int, entry: dict[str, Any]) -> None:
        """Batch 1 again with top-2 logprobs; each divergence from off with its margins."""
        prompts = self.prompts[: self.args.margin_prompts]
        completions = measure.margin_run(llm, prompts, self.args.margin_output_len)
        if method == "off":
            self.margin_reference = completions
            self.result["identity"] = {
                "prompts": len(prompts),
                "output_len": self.args.margin_output_len,
                "num_sequences": 0,
                "num_identical": 0,
                "max_off_margin": None,
                # The top-2 gaps at every position off generated: what a divergence's
                # gap is compared with.
                "off_gaps": measure.gap_quantiles(completions),
                "by_setting": {},
            }
            print(f"  off: top-2 gaps over its positions: {self.result['identity']['off_gaps']}")
            return
        entry["greedy_margins"] = found = measure.margins(self.margin_reference, completions)
        identity = self.result["identity"]
        identity["num_sequences"] += found["num_prompts"]
        identity["num_identical"] += found["num_identical"]
        margins = [identity["max_off_margin"], found["max_off_margin"]]
        identity["max_off_margin"] = max((m for m in margins if m is not None), default=None)
        identity["by_setting"][f"{method} k={k}"] = [
            found["num_identical"],
            found["num_prompts"],
        ]
        self.result["identity"] = identity
        print(
            f"  greedy with top-2 logprobs: {found['num_identical']}/{found['num_prompts']} "
            f"identical to off, largest off top-2 gap at a divergence: {found['max_off_margin']}",
            flush=True,
        )

    def _sweep(self, llm, method: str, k: int) -> None:
        print(f"sweep {method} k={k}:", flush=True)
        self.sweeps[method] = measure.measure_sweep(
            llm, self.sweep_prompts, self.batch_sizes, self.args.sweep_output_len
        )
        others = {m: e for m, e in self.sweeps.items() if m != "off"}
        self.result["sweep"] = {
            **(self.result["sweep"] or {}),
            "k": self.throughput_k,
            "prompt_len": self.args.sweep_prompt_len,
            "output_len": self.args.sweep_output_len,
            "rows": measure.compare_sweeps(self.sweeps["off"], others),
        }
        sweep_result = self.result["sweep"]
        if method == "ngram":
            sweep_result["crossover"] = measure.crossover(sweep_result["rows"])
        if method == "ngram_threshold":
            sweep_result["disable_by_batch_size"] = self.threshold
            sweep_result.setdefault("threshold_from_sweep", False)

    def _throughput(self, llm, method: str, k: int, async_scheduling: bool) -> None:
        run = measure.measure_throughput(llm, self.workload)
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
        ratio = entry["output_tokens_per_s"] / t["off"]["output_tokens_per_s"]
        identical = _identical(run["outputs"], self.throughput_reference)
        if method == "ngram":
            t["ngram"] = entry
            t["ratio_on_over_off"], t["identical_requests"] = ratio, identical
        else:
            entry["disable_by_batch_size"] = self.threshold
            entry["ratio_over_off"], entry["identical_requests"] = ratio, identical
            t["ngram_threshold"] = entry
        print(
            f"throughput with {method} k={k} / off: {ratio:.3f}, "
            f"{identical} of {t['num_requests']} identical",
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
