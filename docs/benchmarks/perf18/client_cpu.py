"""CPU seconds of the benchmark's client processes in call 5, from its ps samples.

call5.sh listed the serving processes every two seconds (``ps -eo pid,ppid,times,args``,
whole seconds of CPU). Its pattern missed the API server (started as ``python3 -m
minivllm.cli serve``); it caught the engine cores and the client processes that
``bench serve`` spawns, four for the warm-up and four for the timed pass of each run.
This sums the clients' last sample per run (grouped by their parent, the run's ``bench``
process, in the order the runs started) and writes the totals.

Usage: python3 docs/benchmarks/perf18/client_cpu.py docs/benchmarks/perf18/call5
"""

from __future__ import annotations

import json
import re
import sys
from pathlib import Path

RUNS = ["s1_offline", "s4", "s1"]  # call5.sh's order: stream interval 1, 4, 1
ROW_RE = re.compile(r"\s*(\d+)\s+(\d+)\s+(\S+)\s+(.*)")


def seconds(times: str) -> float:
    """``ps`` TIMES: whole seconds, or [[dd-]hh:]mm:ss."""
    total = 0.0
    for part in times.replace("-", ":").split(":"):
        total = total * 60 + float(part)
    return total


def main(folder: Path) -> None:
    last: dict[str, tuple[str, float]] = {}
    first_seen: dict[str, int] = {}
    for n, line in enumerate((folder / "ps.txt").read_text().splitlines()):
        m = ROW_RE.match(line)
        if m and "pipe_handle=4" in m[4]:  # a client process (the core's handle is 3)
            last[m[1]] = (m[2], seconds(m[3]))
            first_seen.setdefault(m[2], n)
    parents = sorted(first_seen, key=first_seen.get)
    assert len(parents) == len(RUNS), parents
    result = {"what": __doc__.split("\n\n")[0], "runs": {}}
    for run, parent in zip(RUNS, parents):
        cpu = [s for p, s in last.values() if p == parent]
        result["runs"][run] = {"client_processes": len(cpu), "client_cpu_s": sum(cpu)}
    (folder / "client_cpu.json").write_text(json.dumps(result, indent=1) + "\n")
    print(json.dumps(result, indent=1))


if __name__ == "__main__":
    main(Path(sys.argv[1]))
