"""Sort every committed throughput run by the kind of H200 it ran on.

Each `bench throughput` JSON records the copy bandwidth measured in its process (the
roofline's denominator). Across the rounds those figures fall into two tight groups, about
4.22 and about 4.245 TB/s, never between: two kinds of machine behind the same lease. This
script reads the committed JSON of every round (nothing is measured here), labels each run
by its group, and compares the kinds where the same code ran on both: the fastest of the
repeated timed runs (the one the host disturbed least), processes of one engine build, and
the cold first runs of the thirteenth round on.

Usage: python3 docs/benchmarks/perf18/leases.py [docs/benchmarks] [OUT.json]
"""

from __future__ import annotations

import json
import sys
from pathlib import Path
from statistics import mean

# Halfway between the two groups; no run has measured within 0.01 TB/s of it.
THRESHOLD = 4.235e12
# Same code on both kinds of machine (see each round's provenance.json).
PAIRS = {
    # the eleventh round: the code before and after its change, each on two leases
    "perf9 before": ("perf9/repeats_before_1.json", "perf9/repeats_before_2.json"),
    "perf9 after": ("perf9/repeats_after_1.json", "perf9/repeats_after_2.json"),
    # the sixteenth round: 992f8b6's engine ("keep" and "uncounted" are both as committed)
    "perf14 engine": (
        ["perf14/call1/tp_1_keep.json", "perf14/call1/tp_3_keep.json"],
        ["perf14/call2/tp_1_uncounted.json", "perf14/call2/tp_3_uncounted.json"],
    ),
}
# Cold first runs from the thirteenth round on (perf11/), at the code of their round.
COLD_FROM = ("perf11", "perf12", "perf13", "perf14", "perf15", "perf16", "perf17", "perf18")
# Runs of code that is not the engine's (a variant measured and dropped): not counted.
NOT_ENGINE = {
    "perf13/call2_split/throughput_cold.json",  # decodes split inside the prefill graphs
    "perf16/call3/throughput_cold.json",  # the q/k kernel folded into attention
}


def kind(copy_bandwidth: float) -> str:
    """The group a run's copy bandwidth falls in: ``kind_422`` or ``kind_4245`` (TB/s)."""
    return "kind_4245" if copy_bandwidth > THRESHOLD else "kind_422"


def sampled_run(data: dict) -> tuple[float, float] | None:
    """(output tok/s, share of the roofline) of a file's first timed run at temperature 0.6."""
    if "cold" in data:
        run = data["cold"]["first_run"]
        return run["output_tokens_per_s"], run["fraction_of_roofline"]
    sampled = data.get("minivllm", {}).get("sampled")
    if sampled and "fraction_of_roofline" in sampled:
        return sampled["output_tokens_per_s"], sampled["fraction_of_roofline"]
    return None


def copy_bandwidth(data: dict) -> float | None:
    """The copy bandwidth a file's process measured, wherever that file kind keeps it."""
    if "copy_bandwidth_bytes_per_s" in data:
        return data["copy_bandwidth_bytes_per_s"]
    return data.get("cold", {}).get("roofline", {}).get("copy_bandwidth")


def fastest_repeat(data: dict) -> tuple[float, float]:
    """(tok/s, share of the roofline) of the fastest of a file's repeated timed runs."""
    best = max(data["repeats"]["runs"], key=lambda r: r["output_tokens_per_s"])
    return best["output_tokens_per_s"], best["fraction_of_roofline"]


def side(root: Path, files: str | list[str]) -> dict:
    """One side of a pair: its kind and its speed (fastest repeat, or the processes' mean)."""
    files = [files] if isinstance(files, str) else files
    datas = [json.loads((root / f).read_text()) for f in files]
    kinds = {kind(copy_bandwidth(d)) for d in datas}
    assert len(kinds) == 1, files
    if all("repeats" in d for d in datas):
        tok_s, fraction = fastest_repeat(datas[0])
        how = "fastest of the repeated timed runs"
    else:
        runs = [sampled_run(d) for d in datas]
        tok_s, fraction = mean(r[0] for r in runs), mean(r[1] for r in runs)
        how = "mean of the processes' timed runs at temperature 0.6"
    bandwidth = mean(copy_bandwidth(d) for d in datas)
    return {
        "files": files,
        "kind": kinds.pop(),
        "copy_bandwidth": bandwidth,
        "tok_s": tok_s,
        "fraction_of_roofline": fraction,
        "how": how,
    }


def summarize(root: Path, pairs_by_label: dict, cold_from: tuple[str, ...], command: str) -> dict:
    """Every committed run of ``root`` labelled by kind, the kinds' ranges, the same-code
    ``pairs_by_label`` compared, and the cold first runs of the rounds in ``cold_from``
    by kind (a later round's ``leases.py`` calls this with its own pairs and rounds)."""
    runs = []
    for path in sorted(root.glob("perf*/**/*.json")):
        data = json.loads(path.read_text())
        if not isinstance(data, dict) or (bw := copy_bandwidth(data)) is None:
            continue
        name = path.relative_to(root).as_posix()
        runs.append(
            {
                "file": name,
                "date_utc": data.get("date_utc"),
                "copy_bandwidth": bw,
                "kind": kind(bw),
                "sampled": sampled_run(data),
            }
        )
    groups = {
        k: [r["copy_bandwidth"] for r in runs if r["kind"] == k] for k in ("kind_422", "kind_4245")
    }
    pairs = {}
    for label, (a, b) in pairs_by_label.items():
        fast, slow = side(root, a), side(root, b)
        assert fast["kind"] == "kind_4245" and slow["kind"] == "kind_422", label
        pairs[label.replace(" ", "_")] = {
            "kind_4245": fast,
            "kind_422": slow,
            "tok_s_422_over_4245": slow["tok_s"] / fast["tok_s"],
            "bandwidth_4245_over_422": fast["copy_bandwidth"] / slow["copy_bandwidth"],
            "fraction_points_422_minus_4245": 100
            * (slow["fraction_of_roofline"] - fast["fraction_of_roofline"]),
        }
    cold = [
        r
        for r in runs
        if r["file"].endswith(tuple(f"throughput_cold{s}.json" for s in ("", "_2", "_3")))
        and r["file"].startswith(cold_from)
        and r["file"] not in NOT_ENGINE
    ]
    cold_by_kind = {
        k: {
            "runs": [
                {"file": r["file"], "fraction_of_roofline": r["sampled"][1]}
                for r in cold
                if r["kind"] == k
            ]
        }
        for k in ("kind_422", "kind_4245")
    }
    for entry in cold_by_kind.values():
        fractions = [r["fraction_of_roofline"] for r in entry["runs"]]
        entry.update(
            count=len(fractions),
            min=min(fractions),
            max=max(fractions),
            at_or_above_70=sum(f >= 0.70 for f in fractions),
        )
    last_422 = max(r["date_utc"] for r in runs if r["kind"] == "kind_422")
    return {
        "what": "committed throughput runs sorted by the copy bandwidth their process measured "
        "(two groups: two kinds of H200 behind the leases); nothing measured here",
        "command": command,
        "threshold_bytes_per_s": THRESHOLD,
        "kinds": {
            k: {"runs": len(v), "min_bytes_per_s": min(v), "max_bytes_per_s": max(v)}
            for k, v in groups.items()
        },
        "last_run_on_kind_422_utc": last_422,
        "runs_since_then_all_kind_4245": all(
            r["kind"] == "kind_4245" for r in runs if r["date_utc"] and r["date_utc"] > last_422
        ),
        "runs_since_then": sum(1 for r in runs if r["date_utc"] and r["date_utc"] > last_422),
        "same_code_pairs": pairs,
        "cold_first_runs_by_kind": cold_by_kind,
        "runs": runs,
    }


def write(result: dict, out: Path) -> None:
    """Write ``result`` to ``out`` and print it without its list of runs."""
    out.write_text(json.dumps(result, indent=1) + "\n")
    print(json.dumps({k: v for k, v in result.items() if k != "runs"}, indent=1)[:3000])


def main(root: Path, out: Path) -> None:
    command = ("python3 docs/benchmarks/perf18/leases.py docs/benchmarks "
               "docs/benchmarks/perf18/leases.json")  # fmt: skip
    write(summarize(root, PAIRS, COLD_FROM, command), out)


if __name__ == "__main__":
    root = Path(sys.argv[1] if len(sys.argv) > 1 else "docs/benchmarks")
    main(root, Path(sys.argv[2] if len(sys.argv) > 2 else "leases.json"))
