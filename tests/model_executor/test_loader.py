"""Model loading: registry, safetensors discovery and streaming, and every error path."""

from __future__ import annotations

import json
import shutil
from pathlib import Path

import pytest
import torch
import transformers
from safetensors.torch import load_file, save_file

from minivllm.config import ModelConfig
from minivllm.model_executor.loader import get_model, resolve_model_path
from minivllm.model_executor.models.llama import LlamaForCausalLM
from minivllm.model_executor.models.qwen2 import Qwen2ForCausalLM
from minivllm.model_executor.models.qwen3 import Qwen3ForCausalLM
from minivllm.model_executor.registry import ModelRegistry
from minivllm.model_executor.weight_utils import (
    default_weight_loader,
    find_safetensors_files,
    safetensors_weights_iterator,
)
from tests.tiny_models import make_tiny_model

CPU = torch.device("cpu")


@pytest.fixture(scope="module")
def tiny_llama(tmp_path_factory) -> Path:
    return make_tiny_model("llama", tmp_path_factory.mktemp("llama"))


@pytest.fixture
def llama_copy(tiny_llama, tmp_path) -> Path:
    """A private copy of the tiny checkpoint that a test may damage."""
    return Path(shutil.copytree(tiny_llama, tmp_path / "ckpt"))


def _config(path: Path, dtype: torch.dtype = torch.float32, **overrides) -> ModelConfig:
    hf_config = transformers.AutoConfig.from_pretrained(path)
    for key, value in overrides.items():
        setattr(hf_config, key, value)
    return ModelConfig(model=str(path), hf_config=hf_config, dtype=dtype, max_model_len=64)


def _rewrite_checkpoint(path: Path, edit) -> None:
    file = path / "model.safetensors"
    tensors = load_file(file)
    edit(tensors)
    save_file(tensors, file, metadata={"format": "pt"})


# ---------------------------------------------------------------- registry


def test_registry_resolves_supported_architectures():
    assert ModelRegistry.resolve_model_cls(["LlamaForCausalLM"]) is LlamaForCausalLM
    assert ModelRegistry.resolve_model_cls("Qwen2ForCausalLM") is Qwen2ForCausalLM
    # The first supported name wins.
    assert ModelRegistry.resolve_model_cls(["Nope", "Qwen3ForCausalLM"]) is Qwen3ForCausalLM


def test_unknown_architecture_lists_supported(llama_copy):
    config = _config(llama_copy, architectures=["GPT2LMHeadModel"])
    with pytest.raises(ValueError) as err:
        get_model(config, CPU)
    msg = str(err.value)
    assert "GPT2LMHeadModel" in msg
    for arch in ("LlamaForCausalLM", "Qwen2ForCausalLM", "Qwen3ForCausalLM"):
        assert arch in msg


# ---------------------------------------------------------------- finding and reading files


def test_missing_safetensors_names_the_folder(llama_copy):
    (llama_copy / "model.safetensors").unlink()
    with pytest.raises(FileNotFoundError, match=str(llama_copy)):
        get_model(_config(llama_copy), CPU)
    with pytest.raises(FileNotFoundError, match="does not exist"):
        find_safetensors_files(str(llama_copy / "absent"))


@pytest.mark.parametrize("damage", ["garbage", "truncated"])
def test_corrupt_safetensors_names_the_file(llama_copy, damage):
    file = llama_copy / "model.safetensors"
    if damage == "garbage":
        file.write_bytes(b"\x00\x01 this is not a safetensors file" * 10)
    else:
        data = file.read_bytes()
        file.write_bytes(data[: len(data) // 2])
    with pytest.raises(ValueError, match="model.safetensors"):
        get_model(_config(llama_copy), CPU)


def test_index_json_selects_shards(llama_copy):
    tensors = load_file(llama_copy / "model.safetensors")
    (llama_copy / "model.safetensors").unlink()
    names = sorted(tensors)
    half = len(names) // 2
    shards = {
        "model-00001-of-00002.safetensors": names[:half],
        "model-00002-of-00002.safetensors": names[half:],
    }
    weight_map = {}
    for file, keys in shards.items():
        save_file({k: tensors[k] for k in keys}, llama_copy / file, metadata={"format": "pt"})
        weight_map.update(dict.fromkeys(keys, file))
    index = llama_copy / "model.safetensors.index.json"
    index.write_text(json.dumps({"metadata": {}, "weight_map": weight_map}))
    # A stray file not named by the index must be ignored (it would clash).
    save_file({"garbage": torch.zeros(1)}, llama_copy / "consolidated.safetensors")

    files = find_safetensors_files(str(llama_copy))
    assert [Path(f).name for f in files] == sorted(shards)
    streamed = dict(safetensors_weights_iterator(files))
    assert streamed.keys() == tensors.keys()
    assert all(torch.equal(streamed[k], tensors[k]) for k in tensors)
    get_model(_config(llama_copy), CPU)

    (llama_copy / "model-00002-of-00002.safetensors").unlink()
    with pytest.raises(FileNotFoundError, match="model-00002-of-00002.safetensors"):
        find_safetensors_files(str(llama_copy))


# ---------------------------------------------------------------- checkpoint contents


def test_missing_weight_is_named(llama_copy):
    name = "model.layers.0.mlp.down_proj.weight"
    _rewrite_checkpoint(llama_copy, lambda t: t.pop(name))
    with pytest.raises(ValueError) as err:
        get_model(_config(llama_copy), CPU)
    assert f"weight {name} missing from checkpoint '{llama_copy}'" in str(err.value)


def test_missing_shard_of_fused_weight_is_named(llama_copy):
    _rewrite_checkpoint(llama_copy, lambda t: t.pop("model.layers.1.self_attn.k_proj.weight"))
    with pytest.raises(ValueError, match=r"model\.layers\.1\.self_attn\.k_proj\.weight missing"):
        get_model(_config(llama_copy), CPU)


def test_wrong_shape_is_named(llama_copy):
    name = "model.layers.1.mlp.up_proj.weight"
    _rewrite_checkpoint(llama_copy, lambda t: t.update({name: torch.zeros(7, 64)}))
    with pytest.raises(ValueError) as err:
        get_model(_config(llama_copy), CPU)
    msg = str(err.value)
    assert name in msg and "(7, 64)" in msg and "(128, 64)" in msg


def test_unexpected_tensor_is_rejected(llama_copy):
    _rewrite_checkpoint(llama_copy, lambda t: t.update({"model.extra.weight": torch.zeros(2)}))
    with pytest.raises(ValueError, match="'model.extra.weight' matches no model parameter"):
        get_model(_config(llama_copy), CPU)


def test_rotary_buffers_in_checkpoint_are_skipped(llama_copy):
    extra = "model.layers.0.self_attn.rotary_emb.inv_freq"
    _rewrite_checkpoint(llama_copy, lambda t: t.update({extra: torch.ones(8)}))
    model = get_model(_config(llama_copy), CPU)
    assert not model.training


def test_default_weight_loader_checks_shape():
    param = torch.nn.Parameter(torch.zeros(3), requires_grad=False)
    default_weight_loader(param, torch.arange(3.0))
    assert torch.equal(param, torch.arange(3.0))
    with pytest.raises(ValueError, match=r"\(4,\).*expected \(3,\)"):
        default_weight_loader(param, torch.zeros(4))


# ---------------------------------------------------------------- dtype and defaults


def test_dtype_cast_and_defaults_restored(tiny_llama):
    model = get_model(_config(tiny_llama, dtype=torch.float16), CPU)
    assert {p.dtype for p in model.parameters()} == {torch.float16}
    assert torch.get_default_dtype() == torch.float32
    assert torch.empty(1).device.type == "cpu"


def test_defaults_restored_after_a_failed_build(tiny_llama):
    config = _config(tiny_llama, dtype=torch.bfloat16, hidden_act="gelu")
    with pytest.raises(ValueError, match="hidden_act 'gelu' is not supported"):
        get_model(config, CPU)
    assert torch.get_default_dtype() == torch.float32


# ---------------------------------------------------------------- model paths


def test_resolve_model_path_local_and_missing(tiny_llama, tmp_path):
    assert resolve_model_path(str(tiny_llama)) == str(tiny_llama)
    missing = str(tmp_path / "no" / "such" / "model")
    with pytest.raises(FileNotFoundError, match="no/such/model"):
        resolve_model_path(missing)


def test_resolve_model_path_downloads_hub_ids(monkeypatch, tmp_path):
    import huggingface_hub

    calls = []

    def fake_download(repo_id, allow_patterns):
        calls.append((repo_id, allow_patterns))
        return str(tmp_path)

    monkeypatch.setattr(huggingface_hub, "snapshot_download", fake_download)
    assert resolve_model_path("Qwen/Qwen3-0.6B") == str(tmp_path)
    repo_id, patterns = calls[0]
    assert repo_id == "Qwen/Qwen3-0.6B"
    assert "*.safetensors" in patterns and "config.json" in patterns
    assert not any(p.endswith((".bin", ".pt")) for p in patterns)


def test_resolve_model_path_offline_error(monkeypatch):
    import huggingface_hub

    def offline(repo_id, allow_patterns):
        raise OSError("network is unreachable")

    monkeypatch.setattr(huggingface_hub, "snapshot_download", offline)
    with pytest.raises(FileNotFoundError, match="'Qwen/Qwen3-0.6B'.*network is unreachable"):
        resolve_model_path("Qwen/Qwen3-0.6B")


# ---------------------------------------------------------------- bad files, named at construction

BAD_JSON = '{"architectures": ["LlamaForCausalLM"],,}'


def _engine_config(path):
    from minivllm.engine.arg_utils import EngineArgs

    return EngineArgs(model=str(path), device="cpu", max_model_len=64).create_engine_config()


def _shard_with_index(path: Path, weight_map: object) -> Path:
    """Give the checkpoint an index file mapping every tensor as ``weight_map`` says."""
    index = path / "model.safetensors.index.json"
    index.write_text(json.dumps({"metadata": {}, "weight_map": weight_map}))
    return index


@pytest.mark.parametrize("name", ["config.json", "generation_config.json"])
def test_invalid_json_names_the_file_and_the_position(llama_copy, name):
    (llama_copy / name).write_text(BAD_JSON)
    with pytest.raises(ValueError) as err:
        _engine_config(llama_copy)
    msg = str(err.value)
    assert msg.startswith(f"{llama_copy / name} is not valid JSON: "), msg
    assert "at line 1 column 40 (char 39)" in msg


def test_invalid_index_json_names_the_file_at_construction(llama_copy):
    index = llama_copy / "model.safetensors.index.json"
    index.write_text('{"weight_map": {"a": "model.safetensors"}\n  "metadata": {}}')
    for fail in (
        lambda: find_safetensors_files(str(llama_copy)),
        lambda: _engine_config(llama_copy),
    ):
        with pytest.raises(ValueError) as err:
            fail()
        assert str(err.value).startswith(f"{index} is not valid JSON: Expecting ',' delimiter")
        assert "line 2 column 3" in str(err.value)


@pytest.mark.parametrize(
    "name", ["config.json", "generation_config.json", "model.safetensors.index.json"]
)
@pytest.mark.parametrize("content", ["[1, 2]", '"text"', "null"])
def test_json_that_is_not_an_object_is_named(llama_copy, name, content):
    (llama_copy / name).write_text(content)
    with pytest.raises(ValueError, match=rf"{llama_copy / name} must hold a JSON object"):
        _engine_config(llama_copy)


def test_json_that_is_not_utf8_is_named(llama_copy):
    (llama_copy / "generation_config.json").write_bytes(b'{"eos_token_id": "\xff"}')
    with pytest.raises(ValueError, match=r"generation_config\.json is not UTF-8 text"):
        _engine_config(llama_copy)


@pytest.mark.parametrize(
    "weight_map, message",
    [
        (None, "needs a 'weight_map' object"),
        (["model.safetensors"], "needs a 'weight_map' object"),
        ({"lm_head.weight": 3}, "needs a 'weight_map' object"),
        ({"lm_head.weight": "../model.safetensors"}, "'../model.safetensors', which is not a file"),
        ({"lm_head.weight": "/etc/model.safetensors"}, "which is not a file name"),
    ],
)
def test_index_with_a_bad_weight_map_is_named(llama_copy, weight_map, message):
    index = _shard_with_index(llama_copy, weight_map)
    with pytest.raises(ValueError) as err:
        _engine_config(llama_copy)
    assert str(err.value).startswith(str(index)) and message in str(err.value)


def test_index_naming_a_missing_shard_fails_at_construction(llama_copy):
    _shard_with_index(llama_copy, {"lm_head.weight": "model-00002-of-00002.safetensors"})
    with pytest.raises(FileNotFoundError, match="'model-00002-of-00002.safetensors', which is"):
        _engine_config(llama_copy)


@pytest.mark.parametrize("eos", [["2"], "2", 2.5, True, [2, None], -1])
def test_bad_eos_token_id_in_generation_config_is_named(llama_copy, eos):
    gen = llama_copy / "generation_config.json"
    gen.write_text(json.dumps({**json.loads(gen.read_text()), "eos_token_id": eos}))
    with pytest.raises(ValueError) as err:
        _engine_config(llama_copy)
    assert str(err.value).startswith(f"{gen}: eos_token_id must be a token id"), str(err.value)


def test_good_checkpoint_files_still_load(llama_copy):
    gen = llama_copy / "generation_config.json"
    gen.write_text(json.dumps({**json.loads(gen.read_text()), "eos_token_id": [2, 5]}))
    config = _engine_config(llama_copy)
    assert config.model_config.eos_token_ids == {2, 5}
    # A pathlib.Path names a folder as well as a string does.
    from minivllm.engine.arg_utils import EngineArgs

    by_path = EngineArgs(model=llama_copy, device="cpu", max_model_len=64).create_engine_config()
    assert by_path.model_config.model == str(llama_copy)


@pytest.mark.parametrize("model", [None, 5, "", b"folder", ["a"]])
def test_model_argument_must_name_a_model(model):
    from minivllm import LLM
    from minivllm.engine.arg_utils import EngineArgs

    expected = "model must name a model folder (config.json + *.safetensors) or a Hugging Face"
    with pytest.raises(ValueError) as err:
        EngineArgs(model=model).create_engine_config()
    assert str(err.value).startswith(expected) and repr(model) in str(err.value)
    with pytest.raises(ValueError, match=r"^model must name a model folder"):
        LLM(model=model)
