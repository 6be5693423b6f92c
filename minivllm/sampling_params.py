"""Per-request sampling parameters, with vLLM's names, defaults and meanings.

Upstream counterpart: ``vllm/sampling_params.py`` (``SamplingParams``,
``RequestOutputKind``). Every field is checked when the object is built, type first
(no silent coercion: ``True`` is not an int, ``2.0`` is not a count, ``"0.5"`` is not a
number), then range, so a bad request fails at the call site with a ``ValueError`` that
names the field and the value, never inside a batched kernel where it would take the
other requests of the step down with it.
"""

from __future__ import annotations

import enum
import logging
import math
import numbers
from dataclasses import dataclass, field
from typing import Any

logger = logging.getLogger(__name__)

# Temperatures below this are greedy (vLLM's constant of the same name).
_SAMPLING_EPS = 1e-5
# A positive temperature below this is raised to it, as vLLM does: dividing logits by
# ~0 would overflow float32 to inf and the softmax to NaN.
_MAX_TEMP = 1e-2
# Integers travel to the engine core (msgpack) and into int64 tensors and generators.
_INT64_MIN, _INT64_MAX = -(2**63), 2**63 - 1
# Float fields become float32 tensors: a larger value would turn into inf there.
_FLOAT32_MAX = 3.4028234663852886e38
# vLLM's default VLLM_MAX_N_SEQUENCES: every sample is a request of its own.
_MAX_N = 16384

_INT_FIELDS = ("n", "top_k", "min_tokens")
_OPTIONAL_INT_FIELDS = ("seed", "max_tokens", "logprobs", "prompt_logprobs")
_FLOAT_FIELDS = (
    "temperature",
    "top_p",
    "min_p",
    "presence_penalty",
    "frequency_penalty",
    "repetition_penalty",
)
_BOOL_FIELDS = ("include_stop_str_in_output", "ignore_eos", "skip_special_tokens")


class SamplingType(enum.IntEnum):
    """How a request draws its next token."""

    GREEDY = 0
    RANDOM = 1
    RANDOM_SEED = 2


class RequestOutputKind(enum.IntEnum):
    """What each ``RequestOutput`` of a request in progress holds.

    An ``IntEnum`` (upstream's is a plain ``Enum``) so that it crosses the wire to the
    engine core as a bare integer.
    """

    # The whole output so far, every time.
    CUMULATIVE = 0
    # Only what is new since the previous output (text, token ids, logprobs).
    DELTA = 1
    # Nothing until the request finishes, then the whole output once.
    FINAL_ONLY = 2


def _type_name(value: Any) -> str:
    return f"{value!r} ({type(value).__name__})"


def _is_int(value: Any) -> bool:
    # bool is an int subclass, but seed=True or n=True is a mistake, not a number.
    return isinstance(value, numbers.Integral) and not isinstance(value, bool)


def _is_real(value: Any) -> bool:
    return isinstance(value, numbers.Real) and not isinstance(value, bool)


@dataclass
class SamplingParams:
    """Sampling parameters of one request.

    Attributes:
        n: Number of output sequences to return for the prompt (1 to 16384).
        temperature: Softmax temperature; 0 means greedy decoding.
        top_p: Keep the smallest set of tokens whose probability mass reaches top_p.
        top_k: Keep the k most likely tokens; 0 or -1 disables the filter.
        min_p: Drop tokens whose probability is below min_p times the top probability.
        presence_penalty: Subtracted once from the logit of every token already generated.
        frequency_penalty: Subtracted per occurrence of a token already generated.
        repetition_penalty: Divides positive (multiplies negative) logits of tokens seen in
            the prompt or the output; 1.0 disables it.
        seed: Seed of this request's random generator; None (or -1) draws from the
            engine's generator. Sample ``i`` of an ``n > 1`` request uses ``seed + i``,
            so ``seed + n - 1`` must fit in int64 too.
        max_tokens: Maximum number of tokens to generate. None means "as many as fit":
            up to ``max_model_len`` minus the prompt's length, resolved by the engine
            when the request arrives (as vLLM does).
        min_tokens: Stop conditions other than max_tokens are ignored before this many.
        stop: Strings that end generation when they appear in the output text (one
            string or a list of strings; a string becomes a one-element list).
        stop_token_ids: Token ids that end generation (kept in the output).
        include_stop_str_in_output: Keep the matched stop string in the text.
        ignore_eos: Keep generating after the end-of-sequence token.
        logprobs: Number of top log-probabilities to return per generated token, besides
            the sampled token's own (0: only the sampled token's; True: 1).
        prompt_logprobs: Number of top log-probabilities to return per prompt token,
            besides the prompt token's own.
        skip_special_tokens: Drop special tokens when detokenizing.
        output_kind: What each output of a request in progress holds: everything so far
            (CUMULATIVE), only what is new (DELTA), or nothing before the end
            (FINAL_ONLY).
    """

    n: int = 1
    temperature: float = 1.0
    top_p: float = 1.0
    top_k: int = 0
    min_p: float = 0.0
    presence_penalty: float = 0.0
    frequency_penalty: float = 0.0
    repetition_penalty: float = 1.0
    seed: int | None = None
    max_tokens: int | None = 16
    min_tokens: int = 0
    stop: str | list[str] | None = None
    stop_token_ids: list[int] | None = None
    include_stop_str_in_output: bool = False
    ignore_eos: bool = False
    logprobs: int | None = None
    prompt_logprobs: int | None = None
    skip_special_tokens: bool = True
    output_kind: RequestOutputKind = RequestOutputKind.CUMULATIVE
    # Filled by the engine from the model's generation config, not by users.
    all_stop_token_ids: set[int] = field(default_factory=set, init=False, repr=False)
    eos_token_ids: set[int] = field(default_factory=set, init=False, repr=False)

    def __post_init__(self) -> None:
        # vLLM accepts True for "one logprob"; every other bool is refused below.
        if self.logprobs is True:
            self.logprobs = 1
        if self.prompt_logprobs is True:
            self.prompt_logprobs = 1
        self._verify_types()
        if 0.0 < self.temperature < _MAX_TEMP:
            logger.warning(
                "temperature %s is below %s and may overflow; raised to %s",
                self.temperature,
                _MAX_TEMP,
                _MAX_TEMP,
            )
            self.temperature = _MAX_TEMP
        if self.seed == -1:
            self.seed = None
        if self.top_k == -1:
            self.top_k = 0
        self._verify_args()
        if self.temperature < _SAMPLING_EPS:
            # Greedy: the filters below cannot change an argmax, so switch them off.
            self.temperature = 0.0
            self.top_p, self.top_k, self.min_p = 1.0, 0, 0.0
            if self.n > 1:
                # n identical greedy samples would be pointless; vLLM refuses them.
                raise ValueError(
                    f"SamplingParams.n must be 1 when using greedy sampling, got {self.n}"
                )
        # A union, not a reset: a copy decoded from the wire already holds the EOS ids.
        self.all_stop_token_ids = set(self.all_stop_token_ids) | set(self.stop_token_ids)

    def _bad_type(self, name: str, why: str) -> ValueError:
        return ValueError(f"SamplingParams.{name} {why}, got {_type_name(getattr(self, name))}")

    def _verify_types(self) -> None:
        """Refuse scalars of the wrong type, NaN and infinities; store builtin types."""
        bad = self._bad_type
        for name in (*_INT_FIELDS, *_OPTIONAL_INT_FIELDS):
            value = getattr(self, name)
            if value is None and name in _OPTIONAL_INT_FIELDS:
                continue
            if not _is_int(value):
                none = " or None" if name in _OPTIONAL_INT_FIELDS else ""
                raise bad(name, f"must be an integer{none}")
            if not _INT64_MIN <= value <= _INT64_MAX:
                raise bad(name, "must fit in a signed 64-bit integer")
            setattr(self, name, int(value))
        for name in _FLOAT_FIELDS:
            value = getattr(self, name)
            if not _is_real(value):
                raise bad(name, "must be a number")
            # NaN passes every range check below (comparisons with NaN are False) and
            # then samples token 0 forever; inf and float32 overflow turn logits to NaN.
            if not (math.isfinite(value) and abs(value) <= _FLOAT32_MAX):
                raise bad(name, "must be a finite number (within float32 range)")
            setattr(self, name, float(value))
        for name in _BOOL_FIELDS:
            if not isinstance(getattr(self, name), bool):
                raise bad(name, "must be True or False")
        self._verify_list_types()

    def _verify_list_types(self) -> None:
        """Check ``stop``, ``stop_token_ids`` and ``output_kind``; store plain lists."""
        bad = self._bad_type
        if isinstance(self.stop, str):
            self.stop = [self.stop]
        elif self.stop is None:
            self.stop = []
        elif isinstance(self.stop, (list, tuple)) and all(isinstance(s, str) for s in self.stop):
            self.stop = list(self.stop)
        else:
            raise bad("stop", "must be a string or a list of strings")
        if self.stop_token_ids is None:
            self.stop_token_ids = []
        elif isinstance(self.stop_token_ids, (list, tuple)) and all(
            _is_int(t) and 0 <= t <= _INT64_MAX for t in self.stop_token_ids
        ):
            self.stop_token_ids = [int(t) for t in self.stop_token_ids]
        else:
            raise bad("stop_token_ids", "must be a list of non-negative integer token ids")
        if _is_int(self.output_kind) and self.output_kind in set(RequestOutputKind):
            self.output_kind = RequestOutputKind(self.output_kind)
        else:
            kinds = ", ".join(f"{k.name} ({k.value})" for k in RequestOutputKind)
            raise bad("output_kind", f"must be a RequestOutputKind: {kinds}")

    def _verify_args(self) -> None:
        """Refuse values out of range (types are already checked)."""

        def bad(name: str, why: str) -> ValueError:
            return ValueError(f"SamplingParams.{name} {why}, got {getattr(self, name)!r}")

        if not 1 <= self.n <= _MAX_N:
            raise bad("n", f"must be in [1, {_MAX_N}]")
        if self.temperature < 0.0:
            raise bad("temperature", "must be non-negative")
        if not 0.0 < self.top_p <= 1.0:
            raise bad("top_p", "must be in (0, 1]")
        if self.top_k < 0:
            raise bad("top_k", "must be -1 (disable), 0 (disable) or a positive integer")
        if not 0.0 <= self.min_p <= 1.0:
            raise bad("min_p", "must be in [0, 1]")
        if not -2.0 <= self.presence_penalty <= 2.0:
            raise bad("presence_penalty", "must be in [-2, 2]")
        if not -2.0 <= self.frequency_penalty <= 2.0:
            raise bad("frequency_penalty", "must be in [-2, 2]")
        if self.repetition_penalty <= 0.0:
            raise bad("repetition_penalty", "must be greater than zero")
        if self.seed is not None and self.seed + self.n - 1 > _INT64_MAX:
            # Sample i of an n > 1 request is seeded with seed + i.
            raise bad("seed", f"+ n - 1 must fit in a signed 64-bit integer (n={self.n})")
        if self.max_tokens is not None and self.max_tokens < 1:
            raise bad("max_tokens", "must be at least 1 (or None: up to max_model_len)")
        if self.min_tokens < 0:
            raise bad("min_tokens", "must be non-negative")
        if self.max_tokens is not None and self.min_tokens > self.max_tokens:
            raise bad("min_tokens", f"must not exceed max_tokens={self.max_tokens}")
        # vLLM also takes -1 for "the whole vocabulary"; minivllm does not (docs/sampler.md).
        if self.logprobs is not None and self.logprobs < 0:
            raise bad("logprobs", "must be non-negative")
        if self.prompt_logprobs is not None and self.prompt_logprobs < 0:
            raise bad("prompt_logprobs", "must be non-negative")
        if any(not s for s in self.stop):
            raise bad("stop", "must not contain an empty string")

    @property
    def sampling_type(self) -> SamplingType:
        """Greedy, random from the engine's generator, or random from a per-request seed."""
        if self.temperature == 0.0:
            return SamplingType.GREEDY
        if self.seed is not None:
            return SamplingType.RANDOM_SEED
        return SamplingType.RANDOM

    @property
    def min_tokens_stop_ids(self) -> set[int]:
        """Tokens forbidden until ``min_tokens`` are generated: stop ids and every EOS id.

        This is what vLLM calls ``all_stop_token_ids``: EOS is included even with
        ``ignore_eos``, so ``min_tokens`` also means "no EOS before that many tokens".
        (minivllm's ``all_stop_token_ids`` instead holds the ids that *end* the request,
        which excludes EOS under ``ignore_eos``; the scheduler's ``check_stop`` reads it.)
        """
        return set(self.stop_token_ids) | self.eos_token_ids

    def update_from_generation_config(self, eos_token_ids: set[int]) -> None:
        """Record the model's end-of-sequence ids; they stop generation unless ignore_eos."""
        self.eos_token_ids = set(eos_token_ids)
        if not self.ignore_eos:
            # A new set, not |=: a shallow copy of these params must stay untouched.
            self.all_stop_token_ids = self.all_stop_token_ids | set(eos_token_ids)
