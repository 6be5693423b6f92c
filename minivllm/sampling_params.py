"""Per-request sampling parameters, with vLLM's names, defaults and meanings.

Upstream counterpart: ``vllm/sampling_params.py`` (``SamplingParams``). Values are
validated when the object is built, so a bad request fails at the call site with a
``ValueError`` that names the field, never deep inside a batched kernel.
"""

from __future__ import annotations

import enum
import logging
from dataclasses import dataclass, field

logger = logging.getLogger(__name__)

# Temperatures below this are greedy (vLLM's constant of the same name).
_SAMPLING_EPS = 1e-5
# A positive temperature below this is raised to it, as vLLM does: dividing logits by
# ~0 would overflow float32 to inf and the softmax to NaN.
_MAX_TEMP = 1e-2


class SamplingType(enum.IntEnum):
    """How a request draws its next token."""

    GREEDY = 0
    RANDOM = 1
    RANDOM_SEED = 2


@dataclass
class SamplingParams:
    """Sampling parameters of one request.

    Attributes:
        n: Number of output sequences to return for the prompt.
        temperature: Softmax temperature; 0 means greedy decoding.
        top_p: Keep the smallest set of tokens whose probability mass reaches top_p.
        top_k: Keep the k most likely tokens; 0 or -1 disables the filter.
        min_p: Drop tokens whose probability is below min_p times the top probability.
        presence_penalty: Subtracted once from the logit of every token already generated.
        frequency_penalty: Subtracted per occurrence of a token already generated.
        repetition_penalty: Divides positive (multiplies negative) logits of tokens seen in
            the prompt or the output; 1.0 disables it.
        seed: Seed of this request's random generator; None (or -1) draws from the
            engine's generator.
        max_tokens: Maximum number of tokens to generate.
        min_tokens: Stop conditions other than max_tokens are ignored before this many.
        stop: Strings that end generation when they appear in the output text.
        stop_token_ids: Token ids that end generation (kept in the output).
        include_stop_str_in_output: Keep the matched stop string in the text.
        ignore_eos: Keep generating after the end-of-sequence token.
        logprobs: Number of top log-probabilities to return per generated token, besides
            the sampled token's own (0: only the sampled token's).
        prompt_logprobs: Number of top log-probabilities to return per prompt token,
            besides the prompt token's own.
        skip_special_tokens: Drop special tokens when detokenizing.
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
    # Filled by the engine from the model's generation config, not by users.
    all_stop_token_ids: set[int] = field(default_factory=set, repr=False)
    eos_token_ids: set[int] = field(default_factory=set, init=False, repr=False)

    def __post_init__(self) -> None:
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
        # vLLM accepts True for "one logprob".
        if self.logprobs is True:
            self.logprobs = 1
        if self.prompt_logprobs is True:
            self.prompt_logprobs = 1
        if self.stop is None:
            self.stop = []
        elif isinstance(self.stop, str):
            self.stop = [self.stop]
        else:
            self.stop = list(self.stop)
        self.stop_token_ids = list(self.stop_token_ids or [])
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
        self.all_stop_token_ids = set(self.stop_token_ids)

    def _verify_args(self) -> None:
        def bad(name: str, why: str) -> ValueError:
            return ValueError(f"SamplingParams.{name} {why}, got {getattr(self, name)!r}")

        if self.n < 1:
            raise bad("n", "must be at least 1")
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
        if self.max_tokens is not None and self.max_tokens < 1:
            raise bad("max_tokens", "must be at least 1")
        if self.min_tokens < 0:
            raise bad("min_tokens", "must be non-negative")
        if self.max_tokens is not None and self.min_tokens > self.max_tokens:
            raise bad("min_tokens", f"must not exceed max_tokens={self.max_tokens}")
        if self.logprobs is not None and self.logprobs < 0:
            raise bad("logprobs", "must be non-negative")
        if self.prompt_logprobs is not None and self.prompt_logprobs < 0:
            raise bad("prompt_logprobs", "must be non-negative")
        if not all(isinstance(t, int) for t in self.stop_token_ids):
            raise bad("stop_token_ids", "must contain only integers")
        if any(not s for s in self.stop):
            raise bad("stop", "must not contain an empty string")
        if self.seed is not None and not isinstance(self.seed, int):
            raise bad("seed", "must be an integer or None")

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
