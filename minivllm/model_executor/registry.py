"""Which model class implements a Hugging Face architecture name.

Upstream counterpart: ``vllm/model_executor/models/registry.py`` (``ModelRegistry``,
``_TEXT_GENERATION_MODELS``). A checkpoint's ``config.json`` names its class in
``architectures`` (e.g. ``"Qwen2ForCausalLM"``); the registry maps that name to a
module and class here. Modules are imported only when their architecture is asked for,
so importing the registry stays cheap.
"""

from __future__ import annotations

import importlib

from torch import nn

# architecture name -> (module under minivllm.model_executor.models, class name)
_TEXT_GENERATION_MODELS: dict[str, tuple[str, str]] = {
    "LlamaForCausalLM": ("llama", "LlamaForCausalLM"),
    "Qwen2ForCausalLM": ("qwen2", "Qwen2ForCausalLM"),
    "Qwen3ForCausalLM": ("qwen3", "Qwen3ForCausalLM"),
}


class _ModelRegistry:
    """Lookup table from architecture names to model classes."""

    def __init__(self, models: dict[str, tuple[str, str]]) -> None:
        self.models = dict(models)

    def get_supported_archs(self) -> list[str]:
        """Architecture names minivllm can run."""
        return sorted(self.models)

    def resolve_model_cls(self, architectures: list[str] | str | None) -> type[nn.Module]:
        """Return the class of the first supported name in ``architectures``.

        Raises:
            ValueError: none of the names is supported; the message lists those that are.
        """
        if isinstance(architectures, str):
            architectures = [architectures]
        for arch in architectures or []:
            if arch in self.models:
                module_name, class_name = self.models[arch]
                module = importlib.import_module(f"minivllm.model_executor.models.{module_name}")
                return getattr(module, class_name)
        raise ValueError(
            f"model architectures {list(architectures or [])} are not supported; "
            f"supported architectures: {', '.join(self.get_supported_archs())}"
        )


ModelRegistry = _ModelRegistry(_TEXT_GENERATION_MODELS)
