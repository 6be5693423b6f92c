"""Finding, streaming and copying checkpoint weights (safetensors only).

Upstream counterpart: ``vllm/model_executor/model_loader/weight_utils.py``
(``safetensors_weights_iterator``, ``default_weight_loader``) and
``vllm/utils/torch_utils.py`` (``set_default_torch_dtype``).

Weights are read one tensor at a time with ``safetensors.safe_open``: the file is
memory-mapped and only the tensor asked for is materialised, so peak host memory is one
tensor, not one checkpoint. Nothing is ever unpickled (no ``torch.load``), so a
checkpoint cannot run code on the machine that loads it.
"""

from __future__ import annotations

import contextlib
import json
import os
from collections.abc import Iterable, Iterator
from typing import Any

import torch

SAFETENSORS_INDEX = "model.safetensors.index.json"


def find_safetensors_files(folder: str) -> list[str]:
    """Return the ``*.safetensors`` files of a checkpoint folder, in a stable order.

    When the folder has a ``model.safetensors.index.json`` only the files it names are
    returned: a folder may also hold stray consolidated copies that would otherwise
    load every weight twice.

    Raises:
        FileNotFoundError: ``folder`` does not exist, holds no safetensors file, or its
            index names a file that is absent.
        ValueError: The index is not valid JSON or has no ``weight_map`` of file names.
    """
    if not os.path.isdir(folder):
        raise FileNotFoundError(f"model folder {folder!r} does not exist")
    index_path = os.path.join(folder, SAFETENSORS_INDEX)
    if os.path.isfile(index_path):
        files = [os.path.join(folder, name) for name in _index_file_names(index_path)]
        for path in files:
            if not os.path.isfile(path):
                raise FileNotFoundError(
                    f"{index_path} names {os.path.basename(path)!r}, which is missing "
                    f"from {folder!r}"
                )
    else:
        files = sorted(
            os.path.join(folder, name)
            for name in os.listdir(folder)
            if name.endswith(".safetensors")
        )
    if not files:
        raise FileNotFoundError(
            f"no *.safetensors files in model folder {folder!r} (minivllm loads "
            "safetensors checkpoints only)"
        )
    return files


def read_json_file(path: str) -> dict[str, Any]:
    """Parse one of a checkpoint's JSON files (config, generation config, index).

    Raises:
        ValueError: The file is not UTF-8 JSON, or not a JSON object; the message names
            the file and, for a syntax error, the line and column.
    """
    try:
        with open(path, encoding="utf-8") as f:
            data = json.load(f)
    except json.JSONDecodeError as exc:
        raise ValueError(
            f"{path} is not valid JSON: {exc.msg} at line {exc.lineno} column {exc.colno} "
            f"(char {exc.pos})"
        ) from exc
    except UnicodeDecodeError as exc:
        raise ValueError(f"{path} is not UTF-8 text: {exc}") from exc
    if not isinstance(data, dict):
        raise ValueError(f"{path} must hold a JSON object, got a JSON {type(data).__name__}")
    return data


def _index_file_names(index_path: str) -> list[str]:
    """The shard file names a ``model.safetensors.index.json`` maps tensors to, sorted."""
    weight_map = read_json_file(index_path).get("weight_map")
    if not isinstance(weight_map, dict) or not all(
        isinstance(name, str) for name in weight_map.values()
    ):
        raise ValueError(
            f"{index_path} needs a 'weight_map' object mapping tensor names to file names, "
            f"got {weight_map!r:.200}"
        )
    names = sorted(set(weight_map.values()))
    for name in names:
        # A plain file name: the index must not reach outside the model folder.
        if os.path.basename(name) != name or name in ("", ".", ".."):
            raise ValueError(f"{index_path} names {name!r}, which is not a file name")
    return names


def safetensors_weights_iterator(files: Iterable[str]) -> Iterator[tuple[str, torch.Tensor]]:
    """Yield ``(name, tensor)`` for every tensor of every file, one tensor at a time.

    Tensors come back on the CPU in their stored dtype; the parameter's weight loader
    moves and casts them.

    Raises:
        ValueError: a file is not a readable safetensors file (truncated, garbage);
            the message names the file.
    """
    from safetensors import safe_open

    for path in files:
        try:
            handle = safe_open(path, framework="pt", device="cpu")
        except Exception as exc:  # safetensors raises its own SafetensorError type
            raise ValueError(f"cannot read safetensors file {path!r}: {exc}") from exc
        with handle:
            for name in handle.keys():  # noqa: SIM118 - safe_open is not a dict
                try:
                    tensor = handle.get_tensor(name)
                except Exception as exc:
                    raise ValueError(
                        f"cannot read tensor {name!r} from safetensors file {path!r}: {exc}"
                    ) from exc
                yield name, tensor


def check_shape(what: str, expected: torch.Size, loaded: torch.Size) -> None:
    """Raise a ValueError naming ``what`` when a checkpoint tensor has the wrong shape."""
    if tuple(expected) != tuple(loaded):
        raise ValueError(
            f"{what}: checkpoint tensor has shape {tuple(loaded)}, expected {tuple(expected)}"
        )


def default_weight_loader(param: torch.Tensor, loaded_weight: torch.Tensor) -> None:
    """Copy a whole (unsharded) checkpoint tensor into ``param``, casting its dtype.

    Used for parameters that every tensor-parallel rank holds in full (norm weights).
    """
    check_shape("parameter", param.shape, loaded_weight.shape)
    with torch.no_grad():
        param.copy_(loaded_weight)


@contextlib.contextmanager
def set_default_torch_dtype(dtype: torch.dtype | None) -> Iterator[None]:
    """Create floating-point tensors in ``dtype`` inside the block, then restore.

    Building the model under the target dtype allocates each parameter once, directly
    in its final precision, instead of allocating float32 and converting.
    """
    previous = torch.get_default_dtype()
    if dtype is not None:
        torch.set_default_dtype(dtype)
    try:
        yield
    finally:
        torch.set_default_dtype(previous)
