"""Regenerate the Tracing chapter's pictures: docs/assets/trace/*.png.

Runs ``minivllm trace`` with its defaults (the demo model on the CPU, greedy, eight
prompts of which four share an opening, a 48-token budget and a 32-block pool) and keeps
the three pictures the tracer draws; then the same run with n-gram speculative decoding,
for its drafts picture and its timeline. The run is deterministic, so the pictures change
only when the engine's decisions change.

Usage: python docs/scripts/gen_trace_figures.py   (needs matplotlib; about a minute)
"""

from __future__ import annotations

import sys
import tempfile
from pathlib import Path

REPO_ROOT = Path(__file__).resolve().parents[2]
OUT_DIR = REPO_ROOT / "docs" / "assets" / "trace"
FIGURES = ("timeline.png", "kv_usage.png", "block_table.png")
# The same run with n-gram speculative decoding: its drafts, and the timeline with them.
SPEC_CONFIG = (
    '{"method": "ngram", "num_speculative_tokens": 3, "prompt_lookup_min": 1, '
    '"prompt_lookup_max": 3}'
)
SPEC_FIGURES = {"drafts.png": "drafts.png", "timeline.png": "timeline_spec.png"}


def main() -> int:
    """Run the trace into a temp dir and copy the pictures into the docs."""
    sys.path.insert(0, str(REPO_ROOT))
    from minivllm.cli import main as minivllm_main

    with tempfile.TemporaryDirectory() as tmp:
        rc = minivllm_main(["trace", "--out-dir", tmp])
        if rc:
            return rc
        OUT_DIR.mkdir(parents=True, exist_ok=True)
        for name in FIGURES:
            (OUT_DIR / name).write_bytes((Path(tmp) / name).read_bytes())
            print(f"wrote {(OUT_DIR / name).relative_to(REPO_ROOT)}")
    with tempfile.TemporaryDirectory() as tmp:
        rc = minivllm_main(["trace", "--out-dir", tmp, "--speculative-config", SPEC_CONFIG])
        if rc:
            return rc
        for name, target in SPEC_FIGURES.items():
            (OUT_DIR / target).write_bytes((Path(tmp) / name).read_bytes())
            print(f"wrote {(OUT_DIR / target).relative_to(REPO_ROOT)}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
