"""What the engine reads from a model folder before building anything: its configuration.

Upstream counterpart: ``vllm/transformers_utils/config.py`` (``get_config``, and
``try_get_generation_config`` for the end-of-sequence ids of ``generation_config.json``).
``EngineArgs.create_engine_config`` reads the target's folder and a draft model's with
these, so a missing or broken ``config.json`` is refused, naming the file, before any
worker process, model or KV cache exists.
"""

from __future__ import annotations

import json
import os
from typing import Any


def load_hf_config(model_path: str) -> tuple[Any, set[int]]:
    """Parse config.json (and generation_config.json for EOS ids)."""
    import transformers

    from minivllm.model_executor.weight_utils import read_json_file

    config_file = os.path.join(model_path, "config.json")
    if not os.path.isfile(config_file):
        raise FileNotFoundError(f"no config.json in model folder {model_path!r}")
    read_json_file(config_file)  # a syntax error is reported with its line and column
    try:
        hf_config = transformers.AutoConfig.from_pretrained(model_path)
    except (ValueError, KeyError, OSError, json.JSONDecodeError) as exc:
        raise ValueError(f"cannot parse {config_file}: {exc}") from exc
    eos = _eos_ids(getattr(hf_config, "eos_token_id", None), config_file)
    gen_file = os.path.join(model_path, "generation_config.json")
    if os.path.isfile(gen_file):
        eos |= _eos_ids(read_json_file(gen_file).get("eos_token_id"), gen_file)
    return hf_config, eos


def _eos_ids(value: Any, source: str) -> set[int]:
    """A config's ``eos_token_id`` (absent, one id or a list of ids) as a set of ids."""
    ids = [] if value is None else value if isinstance(value, list) else [value]
    if not all(isinstance(v, int) and not isinstance(v, bool) and v >= 0 for v in ids):
        raise ValueError(
            f"{source}: eos_token_id must be a token id or a list of token ids, got {value!r}"
        )
    return set(ids)


def has_tokenizer(model_path: str) -> bool:
    """Whether the folder holds a tokenizer's files (else ``ModelConfig.tokenizer`` is None)."""
    names = ("tokenizer.json", "tokenizer_config.json", "tokenizer.model", "vocab.json")
    return any(os.path.isfile(os.path.join(model_path, n)) for n in names)
