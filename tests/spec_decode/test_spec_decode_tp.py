"""Speculative decoding at tensor_parallel_size=2: two worker processes over gloo on the CPU.

Every rank receives the drafts in the step message (n-gram) or runs its shard of the
draft model (draft model), verifies them on identical logits with identical seeded
generators, and the engine keeps rank 0's answer. Greedy outputs (with logprobs) must
equal those of one process without speculation; a seeded random request, and the
drafting statistics, must equal those of one process with speculation.
"""

from __future__ import annotations

import multiprocessing

import pytest

from minivllm import LLM, SamplingParams
from tests.spec_decode.test_draft_model import make_target_and_draft
from tests.tiny_models import make_tiny_model

# Prompts that repeat a phrase, so the n-gram proposer finds drafts, and one that does not.
PROMPTS = [[7, 8, 9, 10, 11] * 6, [300, 301, 302] * 9, [42, 43] * 10, list(range(3, 40))]
# A pool of 18 blocks of 8 (one max_model_len request and a bit) for five requests:
# preemptions.
ENGINE = dict(dtype="float32", device="cpu", max_model_len=128, max_num_batched_tokens=32,
              block_size=8, num_kv_blocks=18)  # fmt: skip


def _params() -> list[SamplingParams]:
    greedy = [SamplingParams(temperature=0.0, max_tokens=24) for _ in PROMPTS]
    greedy[1] = SamplingParams(temperature=0.0, max_tokens=24, logprobs=2)
    seeded = SamplingParams(temperature=1.0, seed=7, max_tokens=16)
    return [*greedy, seeded]


def _run(llm: LLM) -> list:
    inputs = [{"prompt_token_ids": p} for p in [*PROMPTS, PROMPTS[0]]]
    return [o.outputs[0] for o in llm.generate(inputs, _params(), use_tqdm=False)]


def _case(method: str, tmp_path) -> tuple[str, dict]:
    if method == "ngram":
        path = make_tiny_model("llama", tmp_path / "llama", num_key_value_heads=2)
        return str(path), {"method": "ngram", "num_speculative_tokens": 3, "prompt_lookup_max": 2}
    target, draft = make_target_and_draft(tmp_path)
    return str(target), {"method": "draft_model", "model": str(draft), "num_speculative_tokens": 3}


@pytest.mark.parametrize("method", ["ngram", "draft_model"])
def test_tp2_speculation_equals_tp1(tmp_path, method: str) -> None:
    path, spec = _case(method, tmp_path)
    plain = _run(LLM(path, **ENGINE))
    # Synchronous, as tensor parallelism with drafts is: async scheduling preempts at
    # other moments, and a preemption changes how many drafts a request verifies.
    tp1 = LLM(path, speculative_config=spec, async_scheduling=False, **ENGINE)
    spec_tp1 = _run(tp1)
    with LLM(path, tensor_parallel_size=2, speculative_config=spec, **ENGINE) as llm:
        spec_tp2 = _run(llm)
        stats = llm.llm_engine.stats
    assert stats.spec_decoding_stats.num_accepted_tokens > 0
    assert stats.num_preemptions > 0
    # The same drafts, accepted the same way, as in one process.
    assert stats.spec_decoding_stats == tp1.llm_engine.stats.spec_decoding_stats
    greedy = slice(0, len(PROMPTS))
    assert [c.token_ids for c in spec_tp2[greedy]] == [c.token_ids for c in plain[greedy]]
    assert spec_tp2[-1].token_ids == spec_tp1[-1].token_ids  # the seeded random request
    with_logprobs, reference = spec_tp2[1], plain[1]
    assert len(with_logprobs.logprobs) == len(with_logprobs.token_ids)
    for position, ref in zip(with_logprobs.logprobs, reference.logprobs, strict=True):
        assert position.keys() == ref.keys()
        for token, entry in position.items():
            assert entry.logprob == pytest.approx(ref[token].logprob, abs=1e-4)
    assert multiprocessing.active_children() == []
