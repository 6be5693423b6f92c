"""User-facing engine arguments and their resolution into a checked configuration.

Upstream counterpart: ``vllm/engine/arg_utils.py`` (``EngineArgs``,
``EngineArgs.create_engine_config``, ``EngineArgs.add_cli_args``,
``EngineArgs.from_cli_args``). Names and meanings follow vLLM; the defaults are
documented on each field. Every check happens here, before anything is allocated
(``hf_config`` reads a model folder's ``config.json``). The command-line flags are
generated from the same fields, so every command that starts an engine (``generate``,
``serve``, ``trace``) accepts the same names as the Python API.
"""

from __future__ import annotations

import argparse
import dataclasses
import json
import logging
import math
import os
from dataclasses import dataclass
from typing import Any

import torch

from minivllm.attention.selector import BACKEND_NAMES, check_attn_backend
from minivllm.config import (
    CacheConfig,
    ModelConfig,
    ParallelConfig,
    SchedulerConfig,
    SpeculativeConfig,
    VllmConfig,
)
from minivllm.distributed.utils import verify_tensor_parallel_size
from minivllm.engine.hf_config import has_tokenizer, load_hf_config
from minivllm.engine.usage import UsageContext, default_max_num_batched_tokens

logger = logging.getLogger(__name__)

_DTYPES = {
    "float32": torch.float32,
    "float16": torch.float16,
    "bfloat16": torch.bfloat16,
}
_DEVICES = ("auto", "cpu", "cuda")


@dataclass
class EngineArgs:
    """Arguments of ``LLM(...)`` and of the ``minivllm`` command.

    Attributes:
        model: Folder with config.json + safetensors, or a Hugging Face hub id.
        tokenizer: Folder of the tokenizer (defaults to ``model``).
        dtype: "auto" (the checkpoint's dtype; float32 checkpoints run in bfloat16 on
            CUDA, as in vLLM), "float32", "float16" or "bfloat16".
        device: "auto" (CUDA when available), "cpu" or "cuda".
        block_size: Tokens per KV block.
        num_kv_blocks: KV pool size in blocks; None sizes it from free memory on CUDA
            (see ``gpu_memory_utilization``) and from ``cpu_kv_cache_space`` on the CPU.
        gpu_memory_utilization: Fraction of the GPU's memory the engine may fill.
        cpu_kv_cache_space: GiB of KV cache on the CPU when num_kv_blocks is None.
            The default of 4 is minivllm's choice: vLLM's VLLM_CPU_KVCACHE_SPACE is unset
            by default, and its CPU worker then sizes the cache from the NUMA node's
            memory (gpu_memory_utilization of it, less what the process uses).
        max_num_seqs: Most requests scheduled in one step.
        max_num_batched_tokens: Most tokens in one step; None: the default for the usage
            context and the GPU (``usage.get_batch_defaults``), raised to max_model_len
            when chunked prefill is off.
        max_model_len: Longest prompt + output (default: the model's
            max_position_embeddings).
        enable_prefix_caching: Reuse KV blocks of identical prefixes.
        enable_chunked_prefill: Split long prompts across steps.
        attention_backend: "auto", "torch" or "triton".
        seed: Seed of the engine's random generator (unseeded requests draw from it).
        tensor_parallel_size: Number of processes the model is split across.
        enforce_eager: Disable CUDA graphs.
        async_scheduling: Overlap the host's work for the next step with the device's
            work on the current one. None (the default) turns it on wherever it is
            supported: without speculative decoding (any ``tensor_parallel_size``), and
            with a draft model on one rank, and with n-gram drafts that have a
            ``disable_by_batch_size`` (it then overlaps the steps above that batch size
            only).
        stream_interval: Tokens between a streamed request's outputs after its first
            (``SchedulerConfig.stream_interval``); 1: an output every step.
        speculative_config: Speculative decoding, upstream's keys:
            ``{"method": "ngram", "num_speculative_tokens": k, "prompt_lookup_min": ...,
            "prompt_lookup_max": ...}`` or ``{"method": "draft_model", "model": PATH,
            "num_speculative_tokens": k}`` (see ``SpeculativeConfig``); None: off. On the
            command line, the same as JSON (``--speculative-config '{...}'``).
    """

    model: str
    tokenizer: str | None = None
    dtype: str = "auto"
    device: str = "auto"
    block_size: int = 16
    num_kv_blocks: int | None = None
    gpu_memory_utilization: float = 0.9
    cpu_kv_cache_space: float = 4.0
    max_num_seqs: int = 256
    max_num_batched_tokens: int | None = None
    max_model_len: int | None = None
    enable_prefix_caching: bool = True
    enable_chunked_prefill: bool = True
    attention_backend: str = "auto"
    seed: int = 0
    tensor_parallel_size: int = 1
    enforce_eager: bool = False
    async_scheduling: bool | None = None
    stream_interval: int = 1
    speculative_config: dict[str, Any] | None = None

    @classmethod
    def from_kwargs(cls, model: str, **kwargs: Any) -> EngineArgs:
        """Build from keyword arguments, rejecting unknown names with a clear message."""
        known = {f.name for f in dataclasses.fields(cls)}
        unknown = sorted(set(kwargs) - known)
        if unknown:
            raise ValueError(
                f"unknown engine argument(s) {unknown}; known: {sorted(known - {'model'})}"
            )
        return cls(model=model, **kwargs)

    @staticmethod
    def add_cli_args(parser: argparse.ArgumentParser) -> argparse.ArgumentParser:
        """Add one flag per field (``max_num_seqs`` -> ``--max-num-seqs``) to ``parser``.

        A boolean becomes an on/off pair (``--enforce-eager`` / ``--no-enforce-eager``);
        a tri-state ``bool | None`` stays None unless either flag is given.
        """
        group = parser.add_argument_group("engine arguments (see minivllm.EngineArgs)")
        group.add_argument(
            "--model",
            default=None,
            help="model folder or hub id (default: the built-in demo model)",
        )
        for f in dataclasses.fields(EngineArgs):
            if f.name == "model":
                continue
            flag = "--" + f.name.replace("_", "-")
            if f.type in ("bool", bool, "bool | None"):  # None = "decide automatically"
                group.add_argument(flag, action=argparse.BooleanOptionalAction, default=f.default)
            elif str(f.type).startswith("dict"):  # a JSON object, as upstream's flags
                group.add_argument(flag, type=_json_object(f.name), default=f.default)
            else:
                kind = {"int | None": int, "int": int, "float": float}.get(str(f.type), str)
                group.add_argument(flag, type=kind, default=f.default)
        return parser

    @classmethod
    def from_cli_args(cls, args: argparse.Namespace) -> EngineArgs:
        """The engine arguments of a namespace parsed with ``add_cli_args``."""
        return cls(**{f.name: getattr(args, f.name) for f in dataclasses.fields(cls)})

    def create_engine_config(
        self, usage_context: UsageContext = UsageContext.LLM_CLASS
    ) -> VllmConfig:
        """Validate every argument and resolve defaults into a ``VllmConfig``; the
        ``usage_context`` (who builds the engine) picks the default token budget."""
        self._check_simple_args()
        speculative_config = self._resolve_speculative_config()
        device = self._resolve_device()
        check_attn_backend(self.attention_backend, device)
        from minivllm.model_executor.loader import resolve_model_path
        from minivllm.model_executor.weight_utils import find_safetensors_files

        model_path = resolve_model_path(os.fspath(self.model))
        hf_config, eos_ids = load_hf_config(model_path)
        # Listing the weights now fails a bad index or a folder without weights here,
        # before any worker process, model or KV cache exists.
        find_safetensors_files(model_path)
        verify_tensor_parallel_size(hf_config, self.tensor_parallel_size, device)
        dtype = self._resolve_dtype(hf_config, device)
        max_model_len = self._resolve_max_model_len(hf_config)
        tokenizer = self.tokenizer or (model_path if has_tokenizer(model_path) else None)
        model_config = ModelConfig(
            model=model_path,
            hf_config=hf_config,
            dtype=dtype,
            max_model_len=max_model_len,
            eos_token_ids=eos_ids,
            tokenizer=tokenizer,
        )
        if speculative_config is not None and speculative_config.method == "draft_model":
            _resolve_draft_model_config(
                speculative_config, model_config, self.tensor_parallel_size, device
            )
        max_batched = self.max_num_batched_tokens or default_max_num_batched_tokens(
            usage_context, device
        )
        if not self.enable_chunked_prefill:
            max_batched = max(max_batched, max_model_len)
        return VllmConfig(
            model_config=model_config,
            cache_config=CacheConfig(
                block_size=self.block_size,
                num_kv_blocks=self.num_kv_blocks,
                gpu_memory_utilization=self.gpu_memory_utilization,
                enable_prefix_caching=self.enable_prefix_caching,
                cpu_kv_cache_space=self.cpu_kv_cache_space,
            ),
            scheduler_config=SchedulerConfig(
                max_num_seqs=self.max_num_seqs,
                max_num_batched_tokens=max_batched,
                enable_chunked_prefill=self.enable_chunked_prefill,
                max_model_len=max_model_len,
                async_scheduling=self._resolve_async_scheduling(),
                stream_interval=self.stream_interval,
            ),
            parallel_config=ParallelConfig(tensor_parallel_size=self.tensor_parallel_size),
            device=device,
            attention_backend=self.attention_backend,
            seed=self.seed,
            enforce_eager=self.enforce_eager or device.type != "cuda",
            speculative_config=speculative_config,
        )

    def _check_simple_args(self) -> None:
        if not isinstance(self.model, (str, os.PathLike)) or not os.fspath(self.model):
            raise ValueError(
                "model must name a model folder (config.json + *.safetensors) or a Hugging "
                f"Face Hub id (owner/name), got {self.model!r}"
            )

        def positive(name: str, optional: bool = True) -> None:
            value = getattr(self, name)
            if value is None and optional:
                return
            # A bool is an int to Python, never a count to the engine.
            if isinstance(value, bool) or not isinstance(value, int) or value < 1:
                raise ValueError(f"{name} must be a positive integer, got {value!r}")

        for name in (
            "block_size",
            "num_kv_blocks",
            "max_num_seqs",
            "max_num_batched_tokens",
            "max_model_len",
            "tensor_parallel_size",
        ):
            positive(name)
        positive("stream_interval", optional=False)
        if self.dtype != "auto" and self.dtype not in _DTYPES:
            raise ValueError(f"dtype must be 'auto' or one of {list(_DTYPES)}, got {self.dtype!r}")
        if self.device not in _DEVICES:
            raise ValueError(f"device must be one of {_DEVICES}, got {self.device!r}")
        if self.attention_backend not in BACKEND_NAMES:
            raise ValueError(
                f"attention_backend must be one of {BACKEND_NAMES}, got {self.attention_backend!r}"
            )
        if not 0.0 < self.gpu_memory_utilization <= 1.0:
            raise ValueError(
                f"gpu_memory_utilization must be in (0, 1], got {self.gpu_memory_utilization!r}"
            )
        if not (math.isfinite(self.cpu_kv_cache_space) and self.cpu_kv_cache_space > 0):
            raise ValueError(
                f"cpu_kv_cache_space must be a positive, finite number of GiB, "
                f"got {self.cpu_kv_cache_space}"
            )

    def _resolve_speculative_config(self) -> SpeculativeConfig | None:
        if self.speculative_config is None:
            return None
        # Any tensor_parallel_size: n-gram drafts reach every rank in the step message,
        # and each rank runs its shard of a draft model.
        return SpeculativeConfig.from_dict(self.speculative_config)

    def _resolve_async_scheduling(self) -> bool:
        why = self._async_scheduling_unsupported()
        if why is not None:
            if self.async_scheduling:
                raise ValueError(
                    f"async_scheduling=True cannot be combined with this speculative_config: "
                    f"{why}; leave async_scheduling None to turn it off automatically"
                )
            if self.async_scheduling is None:
                method = self.speculative_config.get("method", "ngram")
                logger.warning(
                    "Async scheduling not supported with %s-based speculative decoding "
                    "and will be disabled: %s",
                    method,
                    why,
                )
            return False
        if self.async_scheduling is None:
            return True
        return bool(self.async_scheduling)

    def _async_scheduling_unsupported(self) -> str | None:
        """Why the speculative configuration rules async scheduling out, or None.

        As upstream's VllmConfig: a proposer that runs on the device (a draft model)
        keeps it, its drafts staying on the device for the next step (core/
        sched_async_spec.py); the n-gram proposer, which reads each step's tokens on the
        host, does not, unless it has a ``disable_by_batch_size``: the steps above it
        propose nothing and run ahead, the others are waited for.
        """
        spec = self.speculative_config
        if spec is None:
            return None
        if spec.get("method", "ngram") == "ngram" and spec.get("disable_by_batch_size") is not None:
            # Steps above the threshold propose nothing, so the core can run them ahead
            # as without speculation; steps that verify or propose drafts it waits for
            # (EngineDrafter.needs_settling).
            return None
        if spec.get("method", "ngram") != "draft_model":
            return (
                "the drafts of step N+1 are proposed from the tokens step N returns, so "
                "step N+1 cannot be scheduled while step N runs"
            )
        if self.tensor_parallel_size > 1:
            # minivllm's own limit: the step message would need to carry placeholder
            # drafts and every rank to keep the previous step's drafts and accepted
            # counts; not built.
            return (
                "with tensor_parallel_size > 1 the draft model's drafts in flight are not "
                "passed between steps on the workers (minivllm builds that only for one rank)"
            )
        return None

    def _resolve_device(self) -> torch.device:
        if self.device == "cuda" and not torch.cuda.is_available():
            raise ValueError("device='cuda' was requested but CUDA is not available")
        if self.device == "auto":
            return torch.device("cuda" if torch.cuda.is_available() else "cpu")
        return torch.device(self.device)

    def _resolve_dtype(self, hf_config: Any, device: torch.device) -> torch.dtype:
        if self.dtype != "auto":
            return _DTYPES[self.dtype]
        declared = getattr(hf_config, "dtype", None) or getattr(hf_config, "torch_dtype", None)
        if isinstance(declared, str):
            declared = _DTYPES.get(declared, torch.float32)
        dtype = declared if isinstance(declared, torch.dtype) else torch.float32
        if dtype == torch.float32 and device.type == "cuda":
            # As vLLM does: float32 on a GPU doubles the bytes every step must move.
            return torch.bfloat16
        return dtype

    def _resolve_max_model_len(self, hf_config: Any) -> int:
        limit = getattr(hf_config, "max_position_embeddings", None)
        if self.max_model_len is None:
            if limit is None:
                raise ValueError(
                    "max_model_len is required: config.json has no max_position_embeddings"
                )
            return int(limit)
        if limit is not None and self.max_model_len > limit:
            raise ValueError(
                f"max_model_len={self.max_model_len} exceeds the model's "
                f"max_position_embeddings={limit}"
            )
        return self.max_model_len


def _resolve_draft_model_config(
    spec: SpeculativeConfig, target: ModelConfig, tp_size: int, device: torch.device
) -> None:
    """Fill in ``spec.draft_model_config``: the draft runs in the target's dtype, up to
    the target's ``max_model_len``, split over the same ``tp_size`` ranks, and must share
    its vocabulary (checked here, before either model is loaded)."""
    from minivllm.model_executor.registry import ModelRegistry
    from minivllm.model_executor.weight_utils import find_safetensors_files

    path = spec.model
    assert path is not None
    try:
        hf_config, _ = load_hf_config(path)
        ModelRegistry.resolve_model_cls(getattr(hf_config, "architectures", None))
        find_safetensors_files(path)
        verify_tensor_parallel_size(hf_config, tp_size, device)
    except (ValueError, FileNotFoundError) as exc:
        raise ValueError(f"speculative_config: model {path!r}: {exc}") from exc
    limit = getattr(hf_config, "max_position_embeddings", None)
    if limit is not None and limit < target.max_model_len:
        raise ValueError(
            f"speculative_config: model {path!r} has max_position_embeddings={limit}, "
            f"below the engine's max_model_len={target.max_model_len}"
        )
    spec.draft_model_config = ModelConfig(
        model=path,
        hf_config=hf_config,
        dtype=target.dtype,
        max_model_len=target.max_model_len,
        tokenizer=path if has_tokenizer(path) else None,
    )
    spec.verify_equal_vocab(target)


def _json_object(name: str):
    """An argparse type: a JSON object, or a clear error naming the flag."""

    def parse(text: str) -> dict[str, Any]:
        try:
            value = json.loads(text)
        except json.JSONDecodeError as exc:
            raise argparse.ArgumentTypeError(f"--{name.replace('_', '-')}: {exc}") from exc
        if not isinstance(value, dict):
            raise argparse.ArgumentTypeError(f"--{name.replace('_', '-')} must be a JSON object")
        return value

    return parse
