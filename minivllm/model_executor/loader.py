"""Build a model from a Hugging Face checkpoint folder and fill it with its weights.

Upstream counterpart: ``vllm/model_executor/model_loader/`` (``get_model``,
``BaseModelLoader.load_model``, ``DefaultModelLoader``; hub downloads in
``weight_utils.download_weights_from_hf``).

The steps: ``config.json``'s ``architectures`` -> ``ModelRegistry`` -> model class;
construct it directly on the target device in the target dtype (no float32 copy on the
CPU first); stream ``(name, tensor)`` pairs out of the safetensors files into
``model.load_weights``; refuse to return a model with any parameter left unloaded,
since ``torch.empty`` parameters would otherwise compute garbage without a word.
"""

from __future__ import annotations

import os
import re
from collections.abc import Iterable, Iterator

import torch
from torch import nn

from minivllm.config import ModelConfig
from minivllm.model_executor.registry import ModelRegistry
from minivllm.model_executor.weight_utils import (
    find_safetensors_files,
    safetensors_weights_iterator,
    set_default_torch_dtype,
)

# Files a model needs: config, weights, tokenizer, generation defaults. Anything else in
# a hub repository (PyTorch .bin duplicates, ONNX exports, ...) is not downloaded.
HF_ALLOW_PATTERNS = [
    "config.json",
    "generation_config.json",
    "*.safetensors",
    "model.safetensors.index.json",
    "tokenizer*",
    "special_tokens_map.json",
    "vocab.json",
    "merges.txt",
    "*.tiktoken",
]

_HUB_ID = re.compile(r"^[A-Za-z0-9][\w.-]*/[\w.-]+$")


def resolve_model_path(model: str) -> str:
    """Turn ``model`` (a local folder or a Hugging Face Hub id) into a local folder.

    Raises:
        FileNotFoundError: ``model`` is neither an existing folder nor a hub id, or the
            download failed (offline, unknown repository, no access).
    """
    if os.path.isdir(model):
        return model
    if os.path.exists(model) or not _HUB_ID.match(model):
        raise FileNotFoundError(
            f"model {model!r} is not a folder and does not look like a Hugging Face Hub "
            "id (owner/name)"
        )
    from huggingface_hub import snapshot_download

    try:
        return snapshot_download(repo_id=model, allow_patterns=HF_ALLOW_PATTERNS)
    except Exception as exc:  # offline, 404, gated repository, ...
        raise FileNotFoundError(
            f"model {model!r} is not a local folder and could not be downloaded from the "
            f"Hugging Face Hub ({type(exc).__name__}: {exc}). Download it first or pass "
            "a local folder."
        ) from exc


def _recording(
    weights: Iterable[tuple[str, torch.Tensor]], seen: set[str]
) -> Iterator[tuple[str, torch.Tensor]]:
    """Pass ``weights`` through, noting every checkpoint name in ``seen``."""
    for name, tensor in weights:
        seen.add(name)
        yield name, tensor


def _missing_checkpoint_names(model: nn.Module, loaded: set[str], seen: set[str]) -> list[str]:
    """Checkpoint names that would have filled the parameters left unloaded.

    A fused parameter (``qkv_proj``) is reported by the checkpoint tensors it is built
    from that never arrived (``k_proj``), since those are the names a user can find
    in (or miss from) the checkpoint.
    """
    mapping = getattr(model, "stacked_params_mapping", [])
    missing: list[str] = []
    for name, _ in model.named_parameters():
        if name in loaded:
            continue
        sources = [name.replace(fused, shard) for fused, shard, _ in mapping if fused in name]
        missing += [s for s in sources if s not in seen] if sources else [name]
    return missing


def get_model(model_config: ModelConfig, device: torch.device) -> nn.Module:
    """Build the model of ``model_config`` on ``device`` and load its weights.

    Returns:
        The model, in eval mode, every parameter on ``device`` in ``model_config.dtype``.

    Raises:
        ValueError: unsupported architecture; a checkpoint tensor that fits no
            parameter or has the wrong shape; a corrupt safetensors file; parameters
            missing from the checkpoint (all of them are named).
        FileNotFoundError: the model folder holds no safetensors files.
    """
    hf_config = model_config.hf_config
    model_cls = ModelRegistry.resolve_model_cls(getattr(hf_config, "architectures", None))
    folder = model_config.model
    # Look for the files before allocating anything, so a bad folder costs nothing.
    files = find_safetensors_files(folder)
    device = torch.device(device)
    # torch.device as a context manager makes it the default device of every tensor
    # created inside, and restores the previous default on exit, error or not.
    with device, set_default_torch_dtype(model_config.dtype):
        model = model_cls(hf_config)
    seen: set[str] = set()
    # weight_loader's copy_ moves each tensor to the device and casts it to the
    # parameter dtype, so a bf16 checkpoint loads into fp16 (or fp32) without a step.
    loaded = model.load_weights(_recording(safetensors_weights_iterator(files), seen))
    missing = _missing_checkpoint_names(model, loaded, seen)
    if missing:
        shown = ", ".join(missing[:10]) + (
            f" (and {len(missing) - 10} more)" if len(missing) > 10 else ""
        )
        raise ValueError(
            f"weight{'s' if len(missing) > 1 else ''} {shown} missing from checkpoint {folder!r}"
        )
    return model.eval()
