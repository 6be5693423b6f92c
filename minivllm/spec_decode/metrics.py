"""How well the drafts are doing: proposed, accepted, and where in the draft they fail.

Upstream counterpart: ``vllm/v1/spec_decode/metrics.py`` (``SpecDecodingStats``, which
the scheduler fills each step, and ``SpecDecodingLogging``, which turns them into the
log line). minivllm keeps one class that both counts and reports; the Prometheus
counters upstream also exports are left out.

Definitions (upstream's):

* a *draft* is one request's proposal in one step, of ``num_draft_tokens`` tokens;
* acceptance rate = accepted draft tokens / proposed draft tokens;
* acceptance rate at position ``i`` = drafts whose token ``i`` was accepted / drafts
  (a token counts only if all before it were accepted too, so the rates fall with
  ``i``);
* mean acceptance length = 1 + accepted tokens / drafts: the tokens a verification
  step emits per request on average, counting the one the target always adds (the
  corrected or bonus token). Without speculation it would be exactly 1.
"""

from __future__ import annotations

import dataclasses
from dataclasses import dataclass, field


@dataclass
class SpecDecodingStats:
    """Counters over any number of verification steps.

    Attributes:
        num_spec_tokens: ``k``, the most drafts a request can receive per step.
        num_drafts: Drafts verified (requests x steps with at least one draft).
        num_draft_tokens: Draft tokens proposed.
        num_accepted_tokens: Draft tokens accepted.
        num_accepted_tokens_per_pos: ``[k]`` drafts whose token at each position was
            accepted.
    """

    num_spec_tokens: int
    num_drafts: int = 0
    num_draft_tokens: int = 0
    num_accepted_tokens: int = 0
    num_accepted_tokens_per_pos: list[int] = field(default_factory=list)

    def __post_init__(self) -> None:
        if not self.num_accepted_tokens_per_pos:
            self.num_accepted_tokens_per_pos = [0] * self.num_spec_tokens

    def observe_draft(self, num_draft_tokens: int, num_accepted_tokens: int) -> None:
        """Count one request's verification: ``num_accepted_tokens`` of its drafts held."""
        if not 0 <= num_accepted_tokens <= num_draft_tokens <= self.num_spec_tokens:
            raise ValueError(
                f"need 0 <= accepted ({num_accepted_tokens}) <= drafted "
                f"({num_draft_tokens}) <= num_spec_tokens ({self.num_spec_tokens})"
            )
        if num_draft_tokens == 0:
            return
        self.num_drafts += 1
        self.num_draft_tokens += num_draft_tokens
        self.num_accepted_tokens += num_accepted_tokens
        for pos in range(num_accepted_tokens):
            self.num_accepted_tokens_per_pos[pos] += 1

    def copy(self) -> SpecDecodingStats:
        """An independent snapshot (the engine sends one with every step's stats;
        ``copy.deepcopy`` would walk the dataclass generically, a cost paid every step)."""
        return dataclasses.replace(
            self, num_accepted_tokens_per_pos=list(self.num_accepted_tokens_per_pos)
        )

    def merge(self, other: SpecDecodingStats) -> None:
        """Add another step's (or request's) counts to these."""
        if other.num_spec_tokens != self.num_spec_tokens:
            raise ValueError("cannot merge stats of different num_spec_tokens")
        self.num_drafts += other.num_drafts
        self.num_draft_tokens += other.num_draft_tokens
        self.num_accepted_tokens += other.num_accepted_tokens
        for pos, n in enumerate(other.num_accepted_tokens_per_pos):
            self.num_accepted_tokens_per_pos[pos] += n

    @property
    def acceptance_rate(self) -> float:
        """Accepted / proposed draft tokens (NaN before any draft)."""
        if self.num_draft_tokens == 0:
            return float("nan")
        return self.num_accepted_tokens / self.num_draft_tokens

    @property
    def acceptance_rate_per_pos(self) -> list[float]:
        """Per draft position, the share of drafts whose token there was accepted."""
        if self.num_drafts == 0:
            return [float("nan")] * self.num_spec_tokens
        return [n / self.num_drafts for n in self.num_accepted_tokens_per_pos]

    @property
    def mean_acceptance_length(self) -> float:
        """Tokens emitted per verification, the target's own token included."""
        if self.num_drafts == 0:
            return float("nan")
        return 1.0 + self.num_accepted_tokens / self.num_drafts

    def summary(self) -> str:
        """One line for the engine's log, in upstream's wording."""
        rates = ", ".join(f"{r:.3f}" for r in self.acceptance_rate_per_pos)
        return (
            f"SpecDecoding metrics: Mean acceptance length: {self.mean_acceptance_length:.2f}, "
            f"Accepted: {self.num_accepted_tokens} tokens, "
            f"Drafted: {self.num_draft_tokens} tokens, "
            f"Per-position acceptance rate: {rates}, "
            f"Avg Draft acceptance rate: {100 * self.acceptance_rate:.1f}%"
        )
