"""The ``LLM`` API: shapes of the outputs, prompt forms, and errors on bad input."""

from __future__ import annotations

import pytest

from minivllm import LLM, RequestOutput, SamplingParams
from tests.tiny_models import make_tiny_model


def _assert_nothing_allocated(llm: LLM) -> None:
    engine = llm.llm_engine
    assert not engine.has_unfinished_requests()
    kv = engine.engine_core.engine_core.kv_cache_manager
    assert kv.num_free_blocks == kv.num_blocks


def test_output_shape_and_order(llm: LLM) -> None:
    prompts = ["The paged KV cache", {"prompt_token_ids": [5, 6, 7]}, "Block tables"]
    params = [SamplingParams(temperature=0, max_tokens=n) for n in (3, 5, 4)]
    outputs = llm.generate(prompts, params, use_tqdm=False)
    assert [type(o) for o in outputs] == [RequestOutput] * 3
    assert outputs[0].prompt == "The paged KV cache"
    assert outputs[1].prompt is None and outputs[1].prompt_token_ids == [5, 6, 7]
    for o, n in zip(outputs, (3, 5, 4)):
        assert o.finished
        out = o.outputs[0]
        assert out.finish_reason in ("stop", "length")
        assert len(out.token_ids) == n or out.finish_reason == "stop"
        assert isinstance(out.text, str)
    text_ids = llm.get_tokenizer().encode("The paged KV cache")
    assert outputs[0].prompt_token_ids == text_ids
    assert outputs[0].outputs[0].text == llm.get_tokenizer().decode(
        outputs[0].outputs[0].token_ids, skip_special_tokens=True
    )


def test_single_prompt_and_default_params(llm: LLM) -> None:
    outputs = llm.generate("hello", use_tqdm=False)
    assert len(outputs) == 1 and outputs[0].prompt == "hello"
    assert len(outputs[0].outputs[0].token_ids) <= SamplingParams().max_tokens


def test_stop_token_ids_and_ignore_eos(llm: LLM) -> None:
    greedy = (
        llm.generate(
            "a b c", SamplingParams(temperature=0, max_tokens=12, ignore_eos=True), use_tqdm=False
        )[0]
        .outputs[0]
        .token_ids
    )
    stop_at = greedy[4]
    first = greedy.index(stop_at)
    out = llm.generate(
        "a b c",
        SamplingParams(temperature=0, max_tokens=12, ignore_eos=True, stop_token_ids=[stop_at]),
        use_tqdm=False,
    )[0]
    assert out.outputs[0].token_ids == greedy[: first + 1]
    assert out.outputs[0].finish_reason == "stop"
    assert out.outputs[0].stop_reason == stop_at


def test_seeded_temperature_sampling_is_reproducible(llm: LLM) -> None:
    params = SamplingParams(temperature=1.0, seed=1234, max_tokens=10, ignore_eos=True)
    a = (
        llm.generate(
            ["x y", "z"], [params, SamplingParams(temperature=0.7, max_tokens=5)], use_tqdm=False
        )[0]
        .outputs[0]
        .token_ids
    )
    b = llm.generate("x y", params, use_tqdm=False)[0].outputs[0].token_ids
    assert a == b


@pytest.mark.parametrize(
    "prompt, message",
    [
        ({"prompt_token_ids": []}, "empty"),
        ({"prompt_token_ids": list(range(3, 3 + 128))}, "max_model_len=128"),
        ({"tokens": [1, 2]}, "prompt_token_ids"),
        (42, "a prompt is a str or a dict"),
    ],
)
def test_bad_prompt_leaves_nothing_allocated(llm: LLM, prompt, message: str) -> None:
    with pytest.raises(ValueError, match=message):
        llm.generate(["fine prompt", prompt], SamplingParams(max_tokens=4), use_tqdm=False)
    _assert_nothing_allocated(llm)


def test_sampling_params_list_length_must_match(llm: LLM) -> None:
    with pytest.raises(ValueError, match="2 entries for 3 prompts"):
        llm.generate(["a", "b", "c"], [SamplingParams()] * 2, use_tqdm=False)


@pytest.mark.parametrize(
    "kwargs, message",
    [
        (dict(not_an_arg=1), "unknown engine argument"),
        (dict(attention_backend="flash"), "attention_backend must be one of"),
        (dict(dtype="int8"), "dtype must be"),
        (dict(device="tpu"), "device must be"),
        (dict(block_size=0), "block_size must be a positive integer"),
        (dict(max_num_seqs=True), "max_num_seqs must be a positive integer, got True"),
        (dict(stream_interval=0), "stream_interval must be a positive integer"),
        (dict(stream_interval=None), "stream_interval must be a positive integer, got None"),
        (dict(num_kv_blocks=4), "fewer than max_model_len=128"),
        (dict(max_model_len=10**6), "exceeds the model's max_position_embeddings"),
        (dict(gpu_memory_utilization=1.5), "gpu_memory_utilization"),
    ],
)
def test_bad_engine_arguments(model_dir, kwargs, message: str) -> None:
    base = dict(dtype="float32", device="cpu", max_model_len=128)
    with pytest.raises(ValueError, match=message):
        LLM(str(model_dir), **{**base, **kwargs})


def test_missing_model_folder(tmp_path) -> None:
    with pytest.raises((FileNotFoundError, ValueError), match="nowhere"):
        LLM(str(tmp_path / "nowhere"), device="cpu")


def test_unknown_architecture_lists_supported(tmp_path) -> None:
    import json

    path = make_tiny_model("llama", tmp_path / "m")
    cfg = json.loads((path / "config.json").read_text())
    cfg["architectures"] = ["GPT2LMHeadModel"]
    (path / "config.json").write_text(json.dumps(cfg))
    with pytest.raises(ValueError, match="LlamaForCausalLM"):
        LLM(str(path), device="cpu", max_model_len=64)


def test_text_prompt_without_tokenizer_is_rejected(tmp_path) -> None:
    path = make_tiny_model("qwen3", tmp_path / "m")
    llm = LLM(str(path), dtype="float32", device="cpu", max_model_len=64)
    with pytest.raises(ValueError, match="no tokenizer"):
        llm.generate("text", use_tqdm=False)
    out = llm.generate({"prompt_token_ids": [3, 4]}, SamplingParams(max_tokens=2), use_tqdm=False)
    assert out[0].outputs[0].text == ""


def test_token_id_outside_vocabulary(llm: LLM) -> None:
    with pytest.raises(ValueError, match="outside the vocabulary"):
        llm.generate({"prompt_token_ids": [3, 100000]}, use_tqdm=False)
    _assert_nothing_allocated(llm)


def test_a_second_concurrent_generate_is_refused_with_a_clear_error(llm: LLM) -> None:
    # Another thread inside generate() holds the lock; this call must not interleave.
    with llm._lock, pytest.raises(RuntimeError, match="already running in another thread"):
        llm.generate("abc", SamplingParams(max_tokens=2), use_tqdm=False)
    assert llm.generate("abc", SamplingParams(max_tokens=2), use_tqdm=False)[0].finished


def test_generate_refuses_requests_it_did_not_add(llm: LLM) -> None:
    rid = llm.llm_engine.add_request("abc", SamplingParams(max_tokens=3))
    with pytest.raises(RuntimeError, match="did not add"):
        llm.generate("xyz", SamplingParams(max_tokens=2), use_tqdm=False)
    llm.llm_engine.abort_request([rid])
    _assert_nothing_allocated(llm)
    assert llm.generate("xyz", SamplingParams(max_tokens=2), use_tqdm=False)[0].finished
