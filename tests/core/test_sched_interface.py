"""``SchedulerInterface``: the rule it implements for every scheduler (``keeps_token``), and
its claim that the engine core asks nothing else of a scheduler."""

from __future__ import annotations

import pytest

from minivllm import LLM, SamplingParams
from minivllm.core.sched_interface import SchedulerInterface
from minivllm.request import RequestStatus
from tests.core.test_scheduler import make_request, make_scheduler
from tests.engine.test_llm_engine import _workload
from tests.spec_decode.test_spec_decode_e2e import MAX_MODEL_LEN, PREEMPTING, REPEATS, ngram
from tests.tiny_models import make_tiny_model


def test_a_token_is_kept_only_by_the_live_request_under_its_id():
    sched = make_scheduler()
    first = make_request(sched, "a", 6)
    sched.add_request(first)
    sched.schedule()
    assert sched.keeps_token(first)
    sched.finish_requests("a", RequestStatus.FINISHED_ABORTED)
    assert not sched.keeps_token(first)  # aborted while its step ran
    # The id comes back as a new request: the old object's token still goes nowhere.
    second = make_request(sched, "a", 6)
    sched.add_request(second)
    assert sched.keeps_token(second) and not sched.keeps_token(first)


class _OnlyTheInterface:
    """The scheduler as the interface describes it, and nothing more: any other
    attribute the engine core reaches for raises."""

    def __init__(self, scheduler) -> None:
        self._scheduler = scheduler
        self.used: set[str] = set()

    def __getattr__(self, name: str):
        allowed = {n for n in dir(SchedulerInterface) if not n.startswith("_")}
        allowed |= set(SchedulerInterface.__annotations__)
        if name not in allowed:
            raise AssertionError(f"the engine core asked its scheduler for {name!r}")
        self.used.add(name)
        return getattr(self._scheduler, name)


@pytest.mark.parametrize(
    "settings",
    [
        dict(speculative_config=ngram(2), async_scheduling=False),
        # Steps of more than two requests run ahead, the others settle.
        dict(speculative_config={**ngram(2), "disable_by_batch_size": 2}, async_scheduling=True),
    ],
    ids=["sync", "async"],
)
def test_the_engine_core_needs_nothing_beyond_the_interface(tmp_path, settings):
    """Speculative runs with preemption, an abort, prefills in chunks and logprobs,
    through a scheduler that exposes only the interface: the same outputs as through the
    scheduler itself."""
    path = make_tiny_model("llama", tmp_path / "m")
    # Speculation's end-to-end workload, which preempts in this pool, and logprobs.
    prompts, max_tokens = _workload(seed=3, shared_prefix=True)
    prompts = [{"prompt_token_ids": p} for p in [p[:40] for p in prompts] + REPEATS]
    params = [SamplingParams(temperature=0.0, max_tokens=n) for n in max_tokens]
    params += [
        SamplingParams(max_tokens=24, temperature=0.0),
        SamplingParams(max_tokens=24, temperature=0.0, prompt_logprobs=1),
        SamplingParams(max_tokens=24, temperature=0.0, logprobs=1),
    ]
    outputs = []
    for restricted in (False, True):
        llm = LLM(str(path), dtype="float32", device="cpu", max_model_len=MAX_MODEL_LEN,
                  **settings, **PREEMPTING)  # fmt: skip
        core = llm.llm_engine.engine_core.engine_core
        if restricted:
            core.scheduler = proxy = _OnlyTheInterface(core.scheduler)
            core.spec_decode.scheduler = proxy
        engine = llm.llm_engine
        gone = engine.add_request({"prompt_token_ids": REPEATS[0]}, params[-1])
        engine.step()
        engine.abort_request([gone])
        done = llm.generate(prompts, params, use_tqdm=False)
        outputs.append([(o.outputs[0].token_ids, o.outputs[0].logprobs) for o in done])
        assert engine.stats.num_preemptions > 0
    assert outputs[0] == outputs[1]
    assert {"schedule", "update_from_output", "keeps_token", "finish_requests"} <= proxy.used
