"""CPU seconds of a process and of its descendants, read from ``/proc`` (Linux).

``bench serve`` takes one reading of the server it launched before a timed pass and one
after it, so that the JSON says how much CPU the front end (the API server process: HTTP,
detokenizing, one chunk per stream) and the processes below it (the engine core) spent on
that pass. A front end whose CPU seconds come close to the pass's wall time was busy all
along, the sign that it, not the engine, set the pace. Where ``/proc`` is missing (macOS)
the reading is None and the JSON says nothing.
"""

from __future__ import annotations

import os
from pathlib import Path

PROC = Path("/proc")


def _stat_fields(pid: int) -> list[str] | None:
    """The fields of ``/proc/<pid>/stat`` after the command name, or None if it is gone."""
    try:
        text = (PROC / str(pid) / "stat").read_text()
    except OSError:
        return None
    # The name is in parentheses and may hold spaces or parentheses itself.
    return text[text.rindex(")") + 2 :].split()


def _cpu_seconds(fields: list[str]) -> float:
    """utime + stime (fields 14 and 15 of stat, counted from 1) in seconds."""
    return (int(fields[11]) + int(fields[12])) / os.sysconf("SC_CLK_TCK")


def _descendants(pid: int) -> list[int]:
    """Every live process below ``pid`` (children, their children, ...)."""
    parent_of = {}
    for entry in PROC.iterdir():
        if entry.name.isdigit() and (fields := _stat_fields(int(entry.name))) is not None:
            parent_of[int(entry.name)] = int(fields[1])
    found, frontier = [], [pid]
    while frontier:
        below = [p for p, parent in parent_of.items() if parent in frontier]
        found += below
        frontier = below
    return found


def process_tree_cpu(pid: int) -> dict[str, float] | None:
    """CPU seconds so far of ``pid`` itself and of its live descendants together.

    Returns ``{"process_s": ..., "descendants_s": ...}``, or None without ``/proc`` or
    once ``pid`` has exited. A descendant that exited between two readings drops out of
    the second, so differences are meaningful only while the tree stays the same (a
    server between two passes).
    """
    if not PROC.is_dir() or (own := _stat_fields(pid)) is None:
        return None
    below = [f for p in _descendants(pid) if (f := _stat_fields(p)) is not None]
    return {"process_s": _cpu_seconds(own), "descendants_s": sum(map(_cpu_seconds, below))}


def cpu_delta(
    before: dict[str, float] | None, after: dict[str, float] | None, seconds: float
) -> dict[str, float] | None:
    """What a pass of ``seconds`` cost: each part's CPU seconds, and the front end's as a
    share of the wall time (1.0: one core busy throughout)."""
    if before is None or after is None:
        return None
    front = after["process_s"] - before["process_s"]
    return {
        "front_end_cpu_s": front,
        "engine_core_cpu_s": after["descendants_s"] - before["descendants_s"],
        "front_end_busy_share": front / seconds if seconds > 0 else 0.0,
    }
