"""``collective_rpc``: the one way from outside the engine to the model on every rank.

In one process a method name or a callable runs on the in-process model runner; the
multi-process executor takes only names (its tensor-parallel test checks that end to
end, with real worker processes).
"""

from __future__ import annotations

import pytest

from minivllm.executor.multiproc_executor import MultiprocExecutor


def test_uniproc_runs_a_method_by_name_with_args_and_kwargs(llm) -> None:
    blocks = llm.collective_rpc("determine_num_blocks")
    assert isinstance(blocks, list) and len(blocks) == 1 and blocks[0] > 0
    # Keyword arguments reach the method: an unknown one is the method's own TypeError.
    with pytest.raises(TypeError, match="no_such_argument"):
        llm.collective_rpc("determine_num_blocks", kwargs={"no_such_argument": 1})


def test_uniproc_calls_a_callable_with_the_runner_first(llm) -> None:
    def describe(runner, prefix: str, *, suffix: str) -> str:
        return f"{prefix}{type(runner).__name__}{suffix}"

    assert llm.collective_rpc(describe, args=("<",), kwargs={"suffix": ">"}) == ["<ModelRunner>"]
    spec = llm.collective_rpc(lambda runner: runner.kv_spec)[0]
    assert spec.block_size == llm.llm_engine.vllm_config.cache_config.block_size


def test_multiproc_refuses_a_callable_before_touching_any_worker() -> None:
    # No workers are started: the refusal comes before the executor's state is read.
    executor = MultiprocExecutor.__new__(MultiprocExecutor)
    with pytest.raises(TypeError, match="name of a Worker method"):
        executor.collective_rpc(lambda worker: worker.rank)
