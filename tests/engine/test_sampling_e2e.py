"""The sampling surface end to end, through ``LLM.generate`` on a tiny model.

* a batch mixing every option gives each request the tokens it gets alone (also when
  prefills are chunked and requests preempted);
* greedy and repetition_penalty match Hugging Face ``generate``;
* logprobs and prompt logprobs equal the log-softmax of Hugging Face's logits;
* ``n > 1`` samples share the prompt's KV blocks;
* stop strings, stop token ids, min_tokens and max_tokens end generation with vLLM's
  ``finish_reason`` / ``stop_reason`` and text.
"""

from __future__ import annotations

import pytest
import torch

from minivllm import LLM, SamplingParams
from minivllm.sampling_params import RequestOutputKind
from tests.tiny_models import load_hf_model

HF_EOS = 2  # the tiny model's eos_token_id


@pytest.fixture(scope="module")
def hf_model(model_dir):
    return load_hf_model(model_dir)


PROMPTS = [[5 + i, 40, 41, 7 * i + 3, 99, 100 + i] * (1 + i % 3) for i in range(7)]
MIXED = [
    SamplingParams(temperature=0.0, max_tokens=8),
    SamplingParams(temperature=1.0, seed=1, max_tokens=8, ignore_eos=True),
    SamplingParams(temperature=0.8, top_k=5, seed=2, max_tokens=8, ignore_eos=True),
    SamplingParams(temperature=1.2, top_p=0.7, seed=3, max_tokens=8, ignore_eos=True),
    SamplingParams(temperature=1.0, min_p=0.1, seed=4, max_tokens=8, ignore_eos=True),
    SamplingParams(
        temperature=1.0,
        presence_penalty=1.0,
        frequency_penalty=0.5,
        repetition_penalty=1.3,
        seed=5,
        max_tokens=8,
        ignore_eos=True,
    ),
    SamplingParams(temperature=0.0, repetition_penalty=1.4, max_tokens=8, ignore_eos=True),
]


def _tokens(llm: LLM, prompts, params) -> list[list[int]]:
    outs = llm.generate([{"prompt_token_ids": p} for p in prompts], params, use_tqdm=False)
    return [o.outputs[0].token_ids for o in outs]


def test_mixed_batch_gives_each_request_its_alone_tokens(llm: LLM, model_dir) -> None:
    alone = [_tokens(llm, [p], [sp])[0] for p, sp in zip(PROMPTS, MIXED)]
    assert _tokens(llm, PROMPTS, MIXED) == alone
    # Reversed order: other rows, other positions in the batch, same tokens.
    assert _tokens(llm, PROMPTS[::-1], MIXED[::-1]) == alone[::-1]
    # Chunked prefill plus a KV pool so small that requests get preempted.
    tight = LLM(
        str(model_dir),
        dtype="float32",
        device="cpu",
        max_model_len=128,
        num_kv_blocks=10,
        max_num_batched_tokens=20,
    )
    assert _tokens(tight, PROMPTS, MIXED) == alone
    assert tight.llm_engine.stats.num_preemptions > 0


def _hf_generate(hf_model, prompt: list[int], n: int, **kwargs) -> list[int]:
    inp = torch.tensor([prompt])
    with torch.no_grad():
        out = hf_model.generate(
            inp,
            attention_mask=torch.ones_like(inp),
            max_new_tokens=n,
            do_sample=False,
            eos_token_id=HF_EOS,
            pad_token_id=0,
            **kwargs,
        )
    return out[0, len(prompt) :].tolist()


@pytest.mark.parametrize("repetition_penalty", [1.0, 1.5, 0.7])
def test_greedy_and_repetition_penalty_match_hf(llm: LLM, hf_model, repetition_penalty) -> None:
    params = SamplingParams(temperature=0.0, max_tokens=12, repetition_penalty=repetition_penalty)
    ours = _tokens(llm, PROMPTS[:4], params)
    for prompt, tokens in zip(PROMPTS[:4], ours):
        assert tokens == _hf_generate(hf_model, prompt, 12, repetition_penalty=repetition_penalty)


@pytest.mark.parametrize(
    "engine_kwargs",
    [{}, {"max_num_batched_tokens": 8}],
    ids=["one-step-prefill", "chunked-prefill"],
)
def test_logprobs_and_prompt_logprobs_match_hf(model_dir, hf_model, engine_kwargs) -> None:
    llm = LLM(str(model_dir), dtype="float32", device="cpu", max_model_len=128, **engine_kwargs)
    prompt = PROMPTS[5]
    # Temperature 0.5 and top_k: the logprobs must still be the *raw* model's.
    params = SamplingParams(
        temperature=0.5,
        top_k=4,
        seed=9,
        max_tokens=5,
        ignore_eos=True,
        logprobs=3,
        prompt_logprobs=2,
    )
    # The first run fills the prefix cache; the second must not read it (prompt logprobs
    # need every prompt position's logits).
    for _ in range(2):
        out = llm.generate({"prompt_token_ids": prompt}, params, use_tqdm=False)[0]
        assert out.num_cached_tokens == 0
    completion = out.outputs[0]
    full = prompt + completion.token_ids
    with torch.no_grad():
        ref = hf_model(torch.tensor([full])).logits[0].double().log_softmax(-1)

    def check(entry, position: int, token: int, n: int) -> None:
        top = ref[position].topk(n)
        assert list(entry)[0] == token
        assert set(entry) == {token, *top.indices.tolist()}
        for t, lp in entry.items():
            assert abs(lp.logprob - ref[position, t].item()) < 1e-4
            assert lp.rank == int((ref[position] >= ref[position, t]).sum())
        assert entry[token].decoded_token == llm.get_tokenizer().decode([token])

    assert len(completion.logprobs) == len(completion.token_ids)
    for i, token in enumerate(completion.token_ids):
        check(completion.logprobs[i], len(prompt) - 1 + i, token, 3)
    total = sum(completion.logprobs[i][t].logprob for i, t in enumerate(completion.token_ids))
    assert abs(completion.cumulative_logprob - total) < 1e-6
    assert len(out.prompt_logprobs) == len(prompt) and out.prompt_logprobs[0] is None
    for i in range(1, len(prompt)):
        check(out.prompt_logprobs[i], i - 1, prompt[i], 2)


def test_no_logprobs_unless_asked(llm: LLM) -> None:
    out = llm.generate(
        {"prompt_token_ids": PROMPTS[0]}, SamplingParams(max_tokens=2), use_tqdm=False
    )[0]
    assert out.outputs[0].logprobs is None and out.outputs[0].cumulative_logprob is None
    assert out.prompt_logprobs is None


def test_n_samples_share_prompt_blocks(model_dir) -> None:
    llm = LLM(str(model_dir), dtype="float32", device="cpu", max_model_len=128, block_size=16)
    engine = llm.llm_engine
    core = engine.engine_core.engine_core
    prompt = list(range(10, 50))  # 40 tokens: 2 full blocks + 8 tokens
    params = SamplingParams(
        n=4,
        temperature=1.0,
        seed=7,
        max_tokens=6,
        ignore_eos=True,
        output_kind=RequestOutputKind.FINAL_ONLY,
    )
    engine.add_request({"prompt_token_ids": prompt}, params)
    engine.step()  # all four children are prefilled in this one step
    kv = core.kv_cache_manager
    blocks = [kv.get_block_ids(f"{i}_0") for i in range(4)]
    assert all(b[:2] == blocks[0][:2] for b in blocks)  # the full prompt blocks: shared
    assert len({b[2] for b in blocks}) == 4  # the partial block: one each
    held = kv.num_blocks - kv.num_free_blocks
    assert held == 2 + 4  # instead of 4 * 3 without sharing
    cached = [core.scheduler.requests[f"{i}_0"].num_cached_tokens for i in range(4)]
    assert cached == [0, 32, 32, 32]
    outputs = []
    while engine.has_unfinished_requests():
        outputs += engine.step()
    (out,) = outputs
    assert out.request_id == "0"
    assert [c.index for c in out.outputs] == [0, 1, 2, 3]
    # Child i is exactly the n=1 request with seed + i (vLLM's rule).
    for i, c in enumerate(out.outputs):
        single = SamplingParams(temperature=1.0, seed=7 + i, max_tokens=6, ignore_eos=True)
        assert c.token_ids == _tokens(llm, [prompt], single)[0]
    assert len({tuple(c.token_ids) for c in out.outputs}) > 1


def test_n_greedy_is_refused() -> None:
    with pytest.raises(ValueError, match=r"SamplingParams\.n"):
        SamplingParams(n=2, temperature=0.0)


def _greedy_text(llm: LLM, prompt, n: int = 16):
    out = llm.generate(
        {"prompt_token_ids": prompt},
        SamplingParams(temperature=0, max_tokens=n, ignore_eos=True),
        use_tqdm=False,
    )[0].outputs[0]
    return out.token_ids, out.text


def _boundary_stop(llm: LLM, tokens: list[int]) -> tuple[str, int]:
    """A stop string that spans a token boundary, and the index of the token ending it."""
    tok = llm.get_tokenizer()
    for k in range(2, len(tokens) - 1):
        before = tok.decode(tokens[:k])
        after = tok.decode(tokens[: k + 1])
        if len(before) >= 2 and len(after) > len(before) and not before.endswith("\ufffd"):
            stop = before[-2:] + after[len(before)]
            full = tok.decode(tokens)
            if full.find(stop) == len(before) - 2:  # first occurrence is this one
                return stop, k
    pytest.skip("no usable token boundary in this output")


@pytest.mark.parametrize("include", [False, True])
def test_stop_string_across_token_boundary(llm: LLM, include: bool) -> None:
    prompt = PROMPTS[2]
    tokens, text = _greedy_text(llm, prompt)
    stop, k = _boundary_stop(llm, tokens)
    out = llm.generate(
        {"prompt_token_ids": prompt},
        SamplingParams(
            temperature=0,
            max_tokens=16,
            ignore_eos=True,
            stop=["never-there", stop],
            include_stop_str_in_output=include,
        ),
        use_tqdm=False,
    )[0].outputs[0]
    assert out.token_ids == tokens[: k + 1]  # the token completing the string is kept
    cut = text.find(stop)
    assert out.text == (text[: cut + len(stop)] if include else text[:cut])
    assert (out.finish_reason, out.stop_reason) == ("stop", stop)


def test_stop_token_id_min_tokens_and_length(llm: LLM) -> None:
    prompt = PROMPTS[1]
    tokens, _ = _greedy_text(llm, prompt)
    stop_id = tokens[1]
    tok = llm.get_tokenizer()
    out = llm.generate(
        {"prompt_token_ids": prompt},
        SamplingParams(temperature=0, max_tokens=16, ignore_eos=True, stop_token_ids=[stop_id]),
        use_tqdm=False,
    )[0].outputs[0]
    first = tokens.index(stop_id)
    assert out.token_ids == tokens[: first + 1]
    assert (out.finish_reason, out.stop_reason) == ("stop", stop_id)
    assert out.text == tok.decode(tokens[:first])  # the stop token's text is left out
    out = llm.generate(
        {"prompt_token_ids": prompt},
        SamplingParams(
            temperature=0,
            max_tokens=16,
            ignore_eos=True,
            stop_token_ids=[stop_id],
            include_stop_str_in_output=True,
        ),
        use_tqdm=False,
    )[0].outputs[0]
    assert out.text == tok.decode(tokens[: first + 1])
    # min_tokens: the stop id (and EOS) cannot even be sampled before 4 tokens.
    out = llm.generate(
        {"prompt_token_ids": prompt},
        SamplingParams(temperature=0, max_tokens=6, min_tokens=4, stop_token_ids=[stop_id]),
        use_tqdm=False,
    )[0].outputs[0]
    assert len(out.token_ids) >= 4
    assert stop_id not in out.token_ids[:4] and HF_EOS not in out.token_ids[:4]
    # Length: finish_reason "length", no stop_reason.
    out = llm.generate(
        {"prompt_token_ids": prompt},
        SamplingParams(temperature=0, max_tokens=3, ignore_eos=True),
        use_tqdm=False,
    )[0].outputs[0]
    assert (len(out.token_ids), out.finish_reason, out.stop_reason) == (3, "length", None)


def test_stop_string_found_in_last_token_overrides_length(llm: LLM) -> None:
    """A stop string completed by the max_tokens-th token: "stop", as in vLLM."""
    prompt = PROMPTS[2]
    tokens, text = _greedy_text(llm, prompt)
    stop, k = _boundary_stop(llm, tokens)
    out = llm.generate(
        {"prompt_token_ids": prompt},
        SamplingParams(temperature=0, max_tokens=k + 1, ignore_eos=True, stop=[stop]),
        use_tqdm=False,
    )[0].outputs[0]
    assert (out.finish_reason, out.stop_reason) == ("stop", stop)
    assert out.text == text[: text.find(stop)]


def test_finished_requests_free_everything(llm: LLM) -> None:
    llm.generate([{"prompt_token_ids": p} for p in PROMPTS], MIXED, use_tqdm=False)
    engine = llm.llm_engine
    kv = engine.engine_core.engine_core.kv_cache_manager
    assert kv.num_free_blocks == kv.num_blocks
    assert not engine.output_processor.request_states
