"""``LLM.start_profile`` / ``stop_profile``: every rank records its own torch profiler
trace (``worker/profiler.py``), in process and, with tensor parallelism, in each worker
process, where the driver's own profiler would see none of the model's work."""

from __future__ import annotations

import json

import pytest

from minivllm import LLM, SamplingParams
from tests.tiny_models import make_tiny_model

PARAMS = SamplingParams(temperature=0.0, max_tokens=4)
PROMPTS = [{"prompt_token_ids": [5, 6, 7, 8, 9]}]


def _ops(trace_path: str) -> set[str]:
    with open(trace_path) as f:
        events = json.load(f)["traceEvents"]
    return {e.get("name", "") for e in events}


@pytest.mark.parametrize("tp", [1, 2])
def test_each_rank_writes_a_trace_of_the_model_it_ran(tmp_path, tp: int) -> None:
    path = make_tiny_model("qwen3", tmp_path / "model")
    trace_dir = tmp_path / "traces"
    with LLM(str(path), device="cpu", max_model_len=64, tensor_parallel_size=tp) as llm:
        llm.start_profile(str(trace_dir))
        llm.generate(PROMPTS, PARAMS, use_tqdm=False)
        traces = llm.stop_profile()
        assert traces == [str(trace_dir / f"rank{r}_trace.json") for r in range(tp)]
        for r, trace in enumerate(traces):
            ops = _ops(trace)
            # The model's own operators, recorded where they ran.
            assert any("linear" in op or "mm" in op for op in ops), sorted(ops)[:20]
            assert (trace_dir / f"rank{r}_table.txt").read_text().strip()
        # A second profile in the same engine works as the first.
        llm.start_profile(str(trace_dir / "again"))
        llm.generate(PROMPTS, PARAMS, use_tqdm=False)
        assert len(llm.stop_profile()) == tp


@pytest.mark.parametrize("tp", [1, 2])
def test_misuse_is_refused_and_the_engine_serves_on(tmp_path, tp: int) -> None:
    path = make_tiny_model("qwen3", tmp_path / "model")
    with LLM(str(path), device="cpu", max_model_len=64, tensor_parallel_size=tp) as llm:
        with pytest.raises(RuntimeError, match="no profile is running"):
            llm.stop_profile()
        with pytest.raises(ValueError, match="trace_dir"):
            llm.start_profile("")
        llm.start_profile(str(tmp_path / "t"))
        with pytest.raises(RuntimeError, match="already running"):
            llm.start_profile(str(tmp_path / "t2"))
        assert llm.stop_profile() == [
            str(tmp_path / "t" / f"rank{r}_trace.json") for r in range(tp)
        ]
        # A refused call is one call's error: the workers serve on.
        out = llm.generate(PROMPTS, PARAMS, use_tqdm=False)[0].outputs[0]
        assert len(out.token_ids) == PARAMS.max_tokens
