"""Sort every committed throughput run by the kind of H200 it ran on, with this round's runs.

The twentieth round wrote ``perf18/leases.py`` (whose ``leases.json`` its text reads): each
`bench throughput` JSON records the copy bandwidth its process measured, and those figures
fall into two tight groups, about 4.22 and about 4.245 TB/s, never between: two kinds of
machine behind the same lease. This script runs that one's ``summarize`` (nothing is
measured here) with the twenty-second round added: its cold run, its whole-workload runs as
same-code pairs (its second call on the 4.245 kind, its third on the 4.22 kind), and the
longest stretch of runs on one kind between two leases of the other.

Usage: python3 docs/benchmarks/perf20/leases.py [docs/benchmarks] [OUT.json]
"""

from __future__ import annotations

import importlib.util
import sys
from pathlib import Path

_SPEC = importlib.util.spec_from_file_location(
    "perf18_leases", Path(__file__).resolve().parent.parent / "perf18" / "leases.py"
)
perf18 = importlib.util.module_from_spec(_SPEC)
_SPEC.loader.exec_module(perf18)

# Same code on both kinds of machine (see each round's provenance.json).
PAIRS = {
    **perf18.PAIRS,
    # the twenty-second round: the throughput workload with the fused gate/up kernel off
    # (MINIVLLM_GATE_UP_SILU_MAX_M=0) and on (64 rows, the committed table), each on both
    "perf20 apart": ("perf20/call2/full_1_off.json", "perf20/call3/full_1_off.json"),
    "perf20 fused": ("perf20/call2/full_1_on.json", "perf20/call3/full_1_on.json"),
}
# Cold first runs from the thirteenth round on (perf11/), at the code of their round.
COLD_FROM = (*perf18.COLD_FROM, "perf19", "perf20")


def longest_stretch(runs: list[dict], of_kind: str) -> dict:
    """The most runs of ``of_kind`` in a row (by date) between two runs of the other kind:
    how many, and the dates of the other kind's runs on either side."""
    best = {"runs": 0}
    count, since = 0, None
    for r in sorted(runs, key=lambda r: r["date_utc"]):
        if r["kind"] == of_kind:
            count += 1
            continue
        if since is not None and count > best["runs"]:
            best = {"runs": count, "after_utc": since, "until_utc": r["date_utc"]}
        count, since = 0, r["date_utc"]
    return best


def main(root: Path, out: Path) -> None:
    command = ("python3 docs/benchmarks/perf20/leases.py docs/benchmarks "
               "docs/benchmarks/perf20/leases.json")  # fmt: skip
    summary = perf18.summarize(root, PAIRS, COLD_FROM, command)
    dated = [r for r in summary["runs"] if r["date_utc"]]
    stretch = {"longest_stretch_kind_4245": longest_stretch(dated, "kind_4245")}
    # Placed after the runs since the last 4.22 run, which it extends.
    at = list(summary).index("runs_since_then") + 1
    items = list(summary.items())
    perf18.write(dict(items[:at]) | stretch | dict(items[at:]), out)


if __name__ == "__main__":
    root = Path(sys.argv[1] if len(sys.argv) > 1 else "docs/benchmarks")
    main(root, Path(sys.argv[2] if len(sys.argv) > 2 else "leases.json"))
