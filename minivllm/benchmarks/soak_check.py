"""The soak test's oracle: each finished request against a reference run of it.

A request's tokens must not depend on what else the engine was doing: which requests
shared its batches, whether its prompt hit the prefix cache, whether it was preempted
and recomputed, whether its neighbours were aborted. So the reference for each finished
request is the same prompt and parameters run on an idle engine with prefix caching
off and a pool that never preempts (``run_reference``). Greedy requests and seeded
random ones (each seeded request draws from its own generator) must match it token for
token, text and finish reason included.

One difference is allowed, and counted: a numerical near-tie. A batch of another shape
sums in another order, so logits move by float rounding (~1e-6 relative in float32);
where the best two tokens of a greedy request are closer than that, the argmax may
flip and the rest of the output diverges. ``classify`` reruns a differing request alone
with logprobs and calls the difference a tie only when the request is greedy with no
penalty (the raw logprobs then rank exactly what the argmax ranks) and the two
candidates at the first differing position are within ``tie_tolerance`` of each other.
Anything else is a mismatch.
"""

from __future__ import annotations

import copy
import dataclasses
from collections.abc import Iterable, Sequence
from dataclasses import dataclass, field
from typing import Any

from minivllm.benchmarks.soak_workload import SoakRequest
from minivllm.outputs import RequestOutput
from minivllm.sampling_params import RequestOutputKind, SamplingParams

# Logprobs the tie check asks the reference for at each position.
TIE_LOGPROBS = 5


@dataclass
class Completion:
    """One sample as a client saw it (``token_ids`` is None where only text is seen:
    the HTTP server)."""

    token_ids: list[int] | None
    text: str
    finish_reason: str | None = None
    logprobs: list[dict[int, Any]] | None = None


@dataclass
class Observed:
    """What a client saw of one request: its samples, and how it ended (finished, aborted
    by its client, or failed with ``error``)."""

    completions: dict[int, Completion] = field(default_factory=dict)
    finished: bool = False
    aborted: bool = False
    error: str | None = None

    def add(self, output: RequestOutput, kind: RequestOutputKind) -> None:
        """Fold one ``RequestOutput`` in (appended for ``DELTA``, replacing otherwise)."""
        for c in output.outputs:
            old = self.completions.get(c.index)
            if kind == RequestOutputKind.DELTA and old is not None:
                assert old.token_ids is not None
                old.token_ids += c.token_ids
                old.text += c.text
                old.finish_reason = c.finish_reason
            else:
                self.completions[c.index] = Completion(
                    list(c.token_ids), c.text, c.finish_reason, c.logprobs
                )
        self.finished = output.finished


def params_key(params: SamplingParams) -> tuple:
    """The parameters that decide a request's output (not how it is delivered)."""
    return tuple(
        (f.name, repr(getattr(params, f.name)))
        for f in dataclasses.fields(params)
        if f.init and f.name != "output_kind"
    )


def reference_key(request: SoakRequest) -> tuple:
    """Requests with equal keys have equal references (computed once)."""
    return (tuple(request.prompt_token_ids), params_key(request.params))


def run_reference(
    engine: Any, requests: Iterable[SoakRequest], batch: int, logprobs: int | None = None
) -> dict[tuple, list[Completion]]:
    """Run each distinct request to its end on ``engine`` (an idle ``LLMEngine`` with
    prefix caching off and room for ``batch`` requests), at most ``batch`` at a time.

    ``logprobs`` raises each request's logprobs to at least that many (the tie check).
    Returns each request's samples, by ``reference_key``.
    """
    todo: dict[tuple, SoakRequest] = {}
    for r in requests:
        todo.setdefault(reference_key(r), r)
    pending = list(todo.items())
    pending.reverse()
    results: dict[tuple, list[Completion]] = {}
    live: dict[str, tuple] = {}
    while pending or live:
        while pending and len(live) < batch:
            key, r = pending.pop()
            params = copy.copy(r.params)
            params.output_kind = RequestOutputKind.FINAL_ONLY
            if logprobs is not None:
                params.logprobs = max(params.logprobs or 0, logprobs)
            live[engine.add_request({"prompt_token_ids": r.prompt_token_ids}, params)] = key
        for out in engine.step():
            if out.finished:
                key = live.pop(out.request_id)
                results[key] = [
                    Completion(list(c.token_ids), c.text, c.finish_reason, c.logprobs)
                    for c in sorted(out.outputs, key=lambda c: c.index)
                ]
    return results


def same(seen: Completion, ref: Completion) -> bool:
    """Equal tokens (where the client saw them), text and finish reason."""
    if seen.token_ids is not None and seen.token_ids != ref.token_ids:
        return False
    return seen.text == ref.text and seen.finish_reason == ref.finish_reason


def matches(observed: Observed, reference: Sequence[Completion]) -> bool:
    """Every sample of a finished request equals its reference."""
    if sorted(observed.completions) != list(range(len(reference))):
        return False
    return all(same(observed.completions[i], ref) for i, ref in enumerate(reference))


def first_difference(seen: Completion, ref: Completion, tokenizer: Any) -> int | None:
    """The first output position where ``seen`` and ``ref`` chose different tokens.

    From the token ids when the client saw them; otherwise (text only) the first
    position whose reference token no longer continues the seen text. None when the
    tokens agree everywhere both have one (the difference is then not a token choice).
    """
    assert ref.token_ids is not None
    if seen.token_ids is not None:
        for i, (a, b) in enumerate(zip(seen.token_ids, ref.token_ids)):
            if a != b:
                return i
        return None
    if tokenizer is None:
        return None
    for i in range(len(ref.token_ids)):
        text = tokenizer.decode(ref.token_ids[: i + 1], skip_special_tokens=True)
        if not seen.text.startswith(text.rstrip("\ufffd")):
            return i
    return None


def tie_margin(
    params: SamplingParams, seen: Completion, ref: Completion, tokenizer: Any
) -> float | None:
    """The logprob gap between the reference's token and the one the soak chose, at the
    first differing position; None where the difference cannot be a tie (see the module
    docstring). Without the soak's token (text only) the runner-up stands in for it."""
    penalised = (
        params.presence_penalty != 0.0
        or params.frequency_penalty != 0.0
        or params.repetition_penalty != 1.0
    )
    if params.temperature != 0.0 or penalised or ref.logprobs is None:
        return None
    pos = first_difference(seen, ref, tokenizer)
    if pos is None or pos >= len(ref.logprobs):
        return None
    assert ref.token_ids is not None
    chosen = ref.token_ids[pos]
    top = {t: lp.logprob for t, lp in ref.logprobs[pos].items()}
    if seen.token_ids is not None:
        other = seen.token_ids[pos]
        return top[chosen] - top[other] if other in top else None
    if pos < params.min_tokens:  # those were masked from the choice, not from the logprobs
        for t in params.all_stop_token_ids:
            top.pop(t, None)
    rest = [lp for t, lp in top.items() if t != chosen]
    return top[chosen] - max(rest) if rest else None


def classify(
    observed: Observed,
    request: SoakRequest,
    solo: Sequence[Completion],
    tie_tolerance: float,
    tokenizer: Any,
) -> tuple[str, float | None]:
    """Judge a request that differed from its batched reference against ``solo``: the
    request rerun alone, with logprobs.

    Returns the verdict and the smallest margin found (None where none applied). The
    verdict is ``"reference_flip"`` when the soak agrees with the solo run (it was the
    batched reference that differed), ``"tie"`` or ``"mismatch"`` otherwise.
    """
    if matches(observed, solo):
        return "reference_flip", None
    if sorted(observed.completions) != list(range(len(solo))):
        return "mismatch", None
    margins = []
    for i, ref in enumerate(solo):
        seen = observed.completions[i]
        if same(seen, ref):
            continue
        margin = tie_margin(request.params, seen, ref, tokenizer)
        if margin is None or abs(margin) > tie_tolerance:
            return "mismatch", margin
        margins.append(abs(margin))
    return "tie", min(margins, default=None)
