"""Resolved engine configuration.

Upstream counterpart: ``vllm/config/`` (``ModelConfig``, ``CacheConfig``,
``SchedulerConfig``, ``ParallelConfig``, ``SpeculativeConfig``, and ``VllmConfig`` which
holds them all).
``EngineArgs`` (``engine/arg_utils.py``) validates user input and produces these; every
field here is final and checked.
"""

from __future__ import annotations

import json
import os
from collections.abc import Mapping
from dataclasses import dataclass, field, fields
from typing import Any, ClassVar

import torch


@dataclass
class ModelConfig:
    """What model to run and in which precision.

    Attributes:
        model: Local folder holding ``config.json`` and ``*.safetensors`` (a hub id has
            already been downloaded and replaced by its folder).
        hf_config: The parsed Hugging Face config (``transformers.PretrainedConfig``).
        dtype: Parameter and activation dtype.
        max_model_len: Longest sequence (prompt + output) the engine accepts.
        eos_token_ids: End-of-sequence ids from the generation config (may be empty).
        tokenizer: Folder to load the tokenizer from, or None when there is none.
    """

    model: str
    hf_config: Any
    dtype: torch.dtype
    max_model_len: int
    eos_token_ids: set[int] = field(default_factory=set)
    tokenizer: str | None = None

    @property
    def architecture(self) -> str:
        """The first architecture named in ``config.json``."""
        archs = getattr(self.hf_config, "architectures", None) or []
        return archs[0] if archs else "<none>"

    def get_num_kv_heads(self, tp_size: int = 1) -> int:
        """KV heads held by one rank (replicated when fewer heads than ranks)."""
        total = getattr(self.hf_config, "num_key_value_heads", None)
        total = total or self.hf_config.num_attention_heads
        return max(1, total // tp_size)

    def get_head_size(self) -> int:
        """Size of one attention head."""
        head_dim = getattr(self.hf_config, "head_dim", None)
        return head_dim or self.hf_config.hidden_size // self.hf_config.num_attention_heads

    def get_num_layers(self) -> int:
        """Number of decoder layers (one KV cache per layer)."""
        return self.hf_config.num_hidden_layers


@dataclass
class CacheConfig:
    """Paged KV cache geometry.

    Attributes:
        block_size: Tokens per KV block.
        num_kv_blocks: Blocks in the pool; None until sized (profiling or default).
        gpu_memory_utilization: Fraction of GPU memory the engine may use in total.
        enable_prefix_caching: Reuse cached blocks of identical prefixes.
        cpu_kv_cache_space: GiB of KV cache on the CPU when num_kv_blocks is None.
    """

    block_size: int = 16
    num_kv_blocks: int | None = None
    gpu_memory_utilization: float = 0.9
    enable_prefix_caching: bool = True
    cpu_kv_cache_space: float = 4.0


@dataclass
class SchedulerConfig:
    """Per-step budgets.

    Attributes:
        max_num_seqs: Most requests in one step.
        max_num_batched_tokens: Most tokens (prefill and decode together) in one step.
        enable_chunked_prefill: Allow splitting a prompt over several steps.
        max_model_len: Copied from ModelConfig for the scheduler's checks.
        async_scheduling: Schedule and queue step N+1 while step N runs on the device
            (the engine keeps one step in flight).
        stream_interval: A streamed request (``DELTA`` or ``CUMULATIVE`` outputs) gets
            an output for its first token, then once every ``stream_interval`` tokens,
            and when it finishes; 1 (the default) is one per step. Fewer outputs mean less
            work per token in the front end, for coarser chunks. Upstream: the same field.
    """

    max_num_seqs: int = 256
    max_num_batched_tokens: int = 8192
    enable_chunked_prefill: bool = True
    max_model_len: int = 2048
    async_scheduling: bool = False
    stream_interval: int = 1

    def __post_init__(self) -> None:
        """The budgets the scheduler can work with, checked wherever a config is built
        (upstream: ``SchedulerConfig.__post_init__`` and ``verify_max_model_len``)."""
        for name in ("max_num_seqs", "max_num_batched_tokens", "stream_interval"):
            value = getattr(self, name)
            if value < 1:
                raise ValueError(f"SchedulerConfig.{name} must be at least 1, got {value}")
        if self.max_model_len < 2:
            raise ValueError(
                f"SchedulerConfig.max_model_len must be at least 2 (one prompt token and one "
                f"generated token), got {self.max_model_len}"
            )
        if not self.enable_chunked_prefill and self.max_num_batched_tokens < self.max_model_len:
            # Without chunking a (resumed) request must be prefilled in one step; a request
            # longer than the budget would wait forever.
            raise ValueError(
                f"SchedulerConfig.max_num_batched_tokens={self.max_num_batched_tokens} is "
                f"smaller than max_model_len={self.max_model_len}; that needs "
                f"enable_chunked_prefill=True"
            )


@dataclass
class ParallelConfig:
    """How the model is split across processes."""

    tensor_parallel_size: int = 1


@dataclass
class SpeculativeConfig:
    """Speculative decoding: who drafts, and how many tokens per step.

    Upstream counterpart: ``vllm/config/speculative.py`` (``SpeculativeConfig``), with
    its names. minivllm builds the n-gram (prompt lookup) and the draft-model proposers.

    Attributes:
        method: ``"ngram"`` or ``"draft_model"``.
        num_speculative_tokens: ``k``, the most drafts per request and step.
        prompt_lookup_min: Shortest suffix n-gram matched (upstream's default: equal to
            ``prompt_lookup_max``, or 5 when neither is given); n-gram only.
        prompt_lookup_max: Longest suffix n-gram matched; n-gram only.
        model: The draft model's folder (``config.json`` + ``*.safetensors``); draft
            model only. It must share the target's vocabulary.
        disable_by_batch_size: Speculate only in steps of at most this many requests
            (None: always). A step that schedules more requests proposes no drafts, so
            the next step verifies none; below the threshold speculation resumes by
            itself. The name is vLLM v0's (``speculative_disable_by_batch_size``); v1 at
            the pinned commit has no such switch (see the chapter).
        draft_model_config: The draft's resolved ``ModelConfig``, filled in by
            ``EngineArgs`` once the target's is known (not a user key).
    """

    method: str = "ngram"
    num_speculative_tokens: int = 0
    prompt_lookup_min: int | None = None
    prompt_lookup_max: int | None = None
    model: str | None = None
    disable_by_batch_size: int | None = None
    draft_model_config: ModelConfig | None = field(default=None, repr=False)

    METHODS: ClassVar[tuple[str, ...]] = ("ngram", "draft_model")
    # Filled in by the engine, never given by the user.
    _DERIVED: ClassVar[frozenset[str]] = frozenset({"draft_model_config"})

    def __post_init__(self) -> None:
        """Check every field and fill in upstream's prompt-lookup defaults."""
        if self.method not in self.METHODS:
            raise ValueError(
                f"speculative_config: method must be one of {list(self.METHODS)}, got "
                f"{self.method!r}"
            )
        limit = self.disable_by_batch_size
        if limit is not None and (type(limit) is not int or limit < 1):
            raise ValueError(
                "speculative_config.disable_by_batch_size must be a positive integer or "
                f"None, got {limit!r}"
            )
        if self.method == "draft_model":
            self._check_draft_model_fields()
            return
        if self.model is not None:
            raise ValueError(
                "speculative_config: model names a draft model; it needs "
                f"method='draft_model' (got method={self.method!r})"
            )
        for name in ("num_speculative_tokens", "prompt_lookup_min", "prompt_lookup_max"):
            value = getattr(self, name)
            if value is not None and (type(value) is not int or value < 1):
                raise ValueError(
                    f"speculative_config: {name} must be a positive integer, got {value!r}"
                )
        if self.prompt_lookup_min is None and self.prompt_lookup_max is None:
            self.prompt_lookup_min = self.prompt_lookup_max = 5
        elif self.prompt_lookup_min is None:
            self.prompt_lookup_min = self.prompt_lookup_max
        elif self.prompt_lookup_max is None:
            self.prompt_lookup_max = self.prompt_lookup_min
        if self.prompt_lookup_min > self.prompt_lookup_max:
            raise ValueError(
                f"speculative_config: prompt_lookup_min={self.prompt_lookup_min} must be <= "
                f"prompt_lookup_max={self.prompt_lookup_max}"
            )

    def speculates_at(self, batch_size: int) -> bool:
        """Whether a step of ``batch_size`` scheduled requests proposes drafts for the
        next one (``disable_by_batch_size``). The engine (n-gram) and the workers (draft
        model) both ask it with the same step's count, so they always agree."""
        return self.disable_by_batch_size is None or batch_size <= self.disable_by_batch_size

    @classmethod
    def from_dict(cls, values: Mapping[str, Any]) -> SpeculativeConfig:
        """Build from ``LLM(speculative_config={...})``, naming any unknown key."""
        if not isinstance(values, Mapping):
            raise ValueError(f"speculative_config must be a dict, got {type(values).__name__}")
        known = {f.name for f in fields(cls)} - cls._DERIVED
        unknown = sorted(set(values) - known)
        if unknown:
            raise ValueError(
                f"speculative_config: unknown key(s) {unknown}; known: {sorted(known)}"
            )
        if "num_speculative_tokens" not in values:
            raise ValueError("speculative_config: num_speculative_tokens is required")
        return cls(**values)

    def _check_draft_model_fields(self) -> None:
        """``model`` is a folder with a config and safetensors weights; no n-gram keys."""
        if type(self.num_speculative_tokens) is not int or self.num_speculative_tokens < 1:
            raise ValueError(
                "speculative_config: num_speculative_tokens must be a positive integer, got "
                f"{self.num_speculative_tokens!r}"
            )
        for name in ("prompt_lookup_min", "prompt_lookup_max"):
            if getattr(self, name) is not None:
                raise ValueError(
                    f"speculative_config: {name} applies to method='ngram' only, not to "
                    "method='draft_model'"
                )
        if not isinstance(self.model, (str, os.PathLike)) or not os.fspath(self.model):
            raise ValueError(
                "speculative_config: model (the draft model's folder) is required with "
                f"method='draft_model', got {self.model!r}"
            )
        self.model = os.fspath(self.model)
        if not os.path.isdir(self.model):
            raise ValueError(f"speculative_config: model {self.model!r} is not a folder")
        if not os.path.isfile(os.path.join(self.model, "config.json")):
            raise ValueError(
                f"speculative_config: model folder {self.model!r} has no config.json"
            )
        if not any(
            n.endswith((".safetensors", ".safetensors.index.json")) for n in os.listdir(self.model)
        ):
            raise ValueError(
                f"speculative_config: model folder {self.model!r} holds no *.safetensors "
                "weights (minivllm loads safetensors checkpoints only)"
            )

    def verify_equal_vocab(self, target: ModelConfig) -> None:
        """The draft proposes token ids the target verifies: both must mean the same text
        by the same id. Compares the vocabulary sizes and, where both folders have a
        ``tokenizer.json``, the vocabularies themselves (upstream compares the sizes:
        ``verify_equal_vocab_size_if_draft_model``).

        Raises:
            ValueError: naming ``speculative_config.model`` and what differs.
        """
        draft = self.draft_model_config
        assert draft is not None, "draft_model_config is filled in by EngineArgs"
        sizes = [getattr(c.hf_config, "vocab_size", None) for c in (draft, target)]
        if sizes[0] != sizes[1]:
            raise ValueError(
                f"speculative_config: model {self.model!r} has vocab_size={sizes[0]}, the "
                f"target model has vocab_size={sizes[1]}; the draft must share the target's "
                "tokenizer"
            )
        vocabs = [_tokenizer_vocab(c.tokenizer) for c in (draft, target)]
        if None not in vocabs and vocabs[0] != vocabs[1]:
            raise ValueError(
                f"speculative_config: model {self.model!r} has a different tokenizer.json "
                f"vocabulary from the target's ({target.tokenizer!r}); the draft must share "
                "the target's tokenizer"
            )


def _tokenizer_vocab(folder: str | None) -> Any:
    """The token -> id map and added tokens of ``folder/tokenizer.json``, or None."""
    if folder is None or not os.path.isfile(os.path.join(folder, "tokenizer.json")):
        return None
    with open(os.path.join(folder, "tokenizer.json"), encoding="utf-8") as f:
        data = json.load(f)
    model = data.get("model") or {}
    added = sorted((t.get("id"), t.get("content")) for t in data.get("added_tokens") or [])
    return model.get("vocab"), model.get("merges"), added


@dataclass
class VllmConfig:
    """Every resolved setting of one engine instance."""

    model_config: ModelConfig
    cache_config: CacheConfig
    scheduler_config: SchedulerConfig
    parallel_config: ParallelConfig
    device: torch.device
    attention_backend: str = "auto"
    seed: int = 0
    enforce_eager: bool = True
    speculative_config: SpeculativeConfig | None = None
