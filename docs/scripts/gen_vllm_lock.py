"""Regenerate docs/vllm.lock.json: the line of every upstream symbol the chapters link.

Chapters link upstream vLLM by symbol (``[](vllm:vllm/v1/core/block_pool.py#BlockPool)``);
the site needs a line number, and CI has no copy of vLLM. So this script resolves every
``vllm:`` link of ``docs/**/*.md`` in ``vllm-ref/`` (the submodule, populated with
``git submodule update --init vllm-ref``) and commits the answer:

    {"commit": "<sha>", "symbols": {"path#Symbol": line, ...}, "files": ["path", ...]}

The commit is the one the repository records for the ``vllm-ref`` gitlink, and
``vllm-ref`` must be checked out at it. Python symbols resolve with ``ast`` (the line of
``def``/``class``, below any decorator, e.g. ``@triton.jit``); C/CUDA symbols resolve to
their unindented definition line.

Usage:
    python docs/scripts/gen_vllm_lock.py           # rewrite the lock
    python docs/scripts/gen_vllm_lock.py --check   # fail if the lock is stale
"""

from __future__ import annotations

import argparse
import json
import subprocess
import sys
from pathlib import Path

REPO_ROOT = Path(__file__).resolve().parents[2]
sys.path.insert(0, str(REPO_ROOT / "docs" / "hooks"))

from doclinks import SymbolError, find_links, find_symbol, gitlink_commit  # noqa: E402

DOCS_DIR = REPO_ROOT / "docs"
LOCK_PATH = DOCS_DIR / "vllm.lock.json"
VLLM_REF = REPO_ROOT / "vllm-ref"


class LockError(RuntimeError):
    """The lock cannot be built: unpopulated submodule, wrong commit, or a bad link."""


def checkout_commit(ref: Path) -> str:
    """The commit checked out in ``vllm-ref``, or a LockError saying how to populate it."""
    # An unpopulated submodule is an empty folder, where `git rev-parse` would answer
    # for the enclosing repository: require the submodule's own .git.
    if not (ref / ".git").exists() or not (ref / "vllm").is_dir():
        raise LockError(
            f"{ref} is not populated: run `git submodule update --init vllm-ref` first"
        )
    proc = subprocess.run(
        ["git", "-C", str(ref), "rev-parse", "HEAD"], capture_output=True, text=True, check=False
    )
    if proc.returncode != 0:
        raise LockError(
            f"{ref} is not populated: run `git submodule update --init vllm-ref` first"
        )
    return proc.stdout.strip()


def extract(docs_dir: Path = DOCS_DIR, ref: Path = VLLM_REF, commit: str | None = None) -> dict:
    """Resolve every vllm: link of the chapters in ``ref`` and return the lock."""
    commit = commit or gitlink_commit(REPO_ROOT)
    head = checkout_commit(ref)
    if head != commit:
        raise LockError(
            f"vllm-ref is at {head} but the repository pins {commit}: "
            "run `git submodule update vllm-ref`"
        )
    symbols: dict[str, int] = {}
    files: set[str] = set()
    errors: list[str] = []
    for page in sorted(docs_dir.rglob("*.md")):
        chapter = page.relative_to(docs_dir.parent).as_posix()
        for link in find_links(page.read_text(encoding="utf-8")):
            if link.scheme != "vllm":
                continue
            where = f"{chapter}:{link.lineno}: vllm:{link.target}"
            target = ref / link.path
            if link.path.endswith("/") and not target.is_dir():
                errors.append(f"{where}: no directory {link.path!r} in vllm-ref")
                continue
            if not link.path.endswith("/") and not target.is_file():
                errors.append(f"{where}: no file {link.path!r} in vllm-ref")
                continue
            files.add(link.path)
            if link.symbol:
                try:
                    symbols[link.target] = find_symbol(ref, link.path, link.symbol).line
                except (SymbolError, SyntaxError) as exc:
                    errors.append(f"{where}: {exc}")
    if errors:
        raise LockError("unresolvable vllm: links:\n  " + "\n  ".join(errors))
    return {"commit": commit, "symbols": dict(sorted(symbols.items())), "files": sorted(files)}


def dumps(lock: dict) -> str:
    """The lock as committed: stable key order, one entry per line, final newline."""
    return json.dumps(lock, indent=2, sort_keys=True) + "\n"


def main(argv: list[str] | None = None) -> int:
    """Write the lock, or with ``--check`` compare it with a fresh extraction."""
    parser = argparse.ArgumentParser(description=__doc__.split("\n", 1)[0])
    parser.add_argument("--check", action="store_true", help="fail if the lock is stale")
    args = parser.parse_args(argv)
    try:
        fresh = dumps(extract())
    except (LockError, SymbolError) as exc:
        print(f"error: {exc}", file=sys.stderr)
        return 2
    current = LOCK_PATH.read_text(encoding="utf-8") if LOCK_PATH.is_file() else ""
    if args.check:
        if current != fresh:
            old = json.loads(current) if current else {"symbols": {}, "files": []}
            new = json.loads(fresh)
            changed = sorted(
                k
                for k in set(old["symbols"]) | set(new["symbols"])
                if old["symbols"].get(k) != new["symbols"].get(k)
            )
            print(
                f"{LOCK_PATH.relative_to(REPO_ROOT)} is stale (differs for: "
                f"{', '.join(changed) or 'commit/files'}); "
                "run `python docs/scripts/gen_vllm_lock.py`",
                file=sys.stderr,
            )
            return 1
        print(f"{LOCK_PATH.relative_to(REPO_ROOT)} is up to date")
        return 0
    LOCK_PATH.write_text(fresh, encoding="utf-8")
    n = len(json.loads(fresh)["symbols"])
    print(f"wrote {LOCK_PATH.relative_to(REPO_ROOT)}: {n} symbols")
    return 0


if __name__ == "__main__":
    sys.exit(main())
