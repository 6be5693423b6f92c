"""The draft's whole proposal as one CUDA graph (``spec_decode/draft_graph.py``) proposes
what the eager path proposes.

On the CPU each graph is emulated: a replay runs the computation the graph records over
the same static, padded buffers. Every replay is checked against the eager path
(``DraftModelProposer._layout`` and its passes) on the same step, and the tokens must
equal speculation off, with async scheduling on and off, preemptions, requests running
into ``max_model_len`` and batches padded up to a captured size.
"""

from __future__ import annotations

import pytest
import torch

from minivllm import LLM, SamplingParams
from minivllm.spec_decode.draft_graph import DraftProposalGraphs
from minivllm.worker.cuda_graph import default_capture_sizes
from tests.spec_decode.test_draft_model import (
    MAX_MODEL_LEN,
    PREEMPTING,
    REPEATS,
    draft_model,
)


class _EmulatedProposal:
    """A captured proposal's stand-in on the CPU."""

    def __init__(self, graphs: DraftProposalGraphs, size: int) -> None:
        self.graphs, self.size = graphs, size

    def replay(self) -> None:
        with torch.inference_mode():
            self.graphs.propose(self.size)


def _install_checked_proposal_graphs(runner) -> None:
    """What ``initialize_kv_cache`` does on a GPU, emulated, with every replay checked."""
    sizes = default_capture_sizes(runner.scheduler_config.max_num_seqs)
    graphs = DraftProposalGraphs(runner.drafter, sizes)
    graphs.graphs = {size: _EmulatedProposal(graphs, size) for size in graphs.capture_sizes}
    runner.drafter.proposal_graphs = graphs
    _check_captured_proposals(runner)


def _checks(runner):
    return runner._proposal_checks[:2] + [sorted(runner._proposal_checks[2])]


def _generate(path, prompts, params, **kwargs) -> list[list[int]]:
    llm = LLM(str(path), dtype="float32", device="cpu", max_model_len=MAX_MODEL_LEN, **kwargs)
    if "speculative_config" in kwargs:
        llm.collective_rpc(_install_checked_proposal_graphs)
    outputs = llm.generate([{"prompt_token_ids": p} for p in prompts], params, use_tqdm=False)
    tokens = [o.outputs[0].token_ids for o in outputs]
    checks = llm.collective_rpc(_checks)[0] if "speculative_config" in kwargs else None
    return tokens, checks


@pytest.mark.parametrize("k", [1, 3])
@pytest.mark.parametrize("async_scheduling", [True, False])
def test_proposal_graphs_equal_the_eager_path(pair, k: int, async_scheduling: bool) -> None:
    """Three requests (padded to a graph of four), two of them running into
    max_model_len, in a pool that forces preemptions: every replayed proposal equals the
    eager one, and the tokens equal speculation off."""
    # 30 blocks of 8: all three run side by side at first, then the two long ones crowd
    # the pool and one is preempted.
    pool = dict(PREEMPTING, num_kv_blocks=30)
    target, draft = pair
    prompts = [*REPEATS, list(range(3, 60))]
    params = [
        SamplingParams(temperature=0.0, max_tokens=MAX_MODEL_LEN, ignore_eos=True),
        SamplingParams(temperature=0.0, max_tokens=24, ignore_eos=True),
        SamplingParams(temperature=0.0, max_tokens=MAX_MODEL_LEN, ignore_eos=True),
    ]
    reference, _ = _generate(target, prompts, params, max_num_seqs=4, **pool)
    tokens, (replays, mismatches, sizes) = _generate(
        target,
        prompts,
        params,
        max_num_seqs=4,
        speculative_config=draft_model(draft, k),
        async_scheduling=async_scheduling,
        **pool,
    )
    assert tokens == reference
    assert replays > 10 and mismatches == 0, (replays, mismatches)
    assert any(size > num_reqs for size, num_reqs in sizes), sizes  # padded rows ran


@pytest.mark.gpu
def test_on_the_gpu_the_captured_proposal_equals_the_eager_path() -> None:
    """On a GPU with CUDA graphs (float32): the demo model with its shipped draft replays
    captured proposals, each equal to the eager path's on the same step, and the greedy
    tokens equal speculation off."""
    from minivllm.demo import demo_draft_path, demo_model_path

    if not torch.cuda.is_available():
        pytest.skip("needs a CUDA GPU")
    prompts = ["In the beginning", "And God said", "The LORD is my shepherd"]
    params = SamplingParams(temperature=0.0, max_tokens=48, ignore_eos=True)
    args = dict(device="cuda", dtype="float32", max_model_len=256, num_kv_blocks=256)
    args.update(max_num_seqs=4, enforce_eager=False)
    runs = []
    for spec in (None, draft_model(demo_draft_path(), 3)):
        llm = LLM(str(demo_model_path()), speculative_config=spec, **args)
        if spec is not None:
            # Graphs captured by the engine; wrap their run with the eager comparison.
            llm.collective_rpc(_check_captured_proposals)
        outs = llm.generate(prompts, params, use_tqdm=False)
        runs.append([o.outputs[0].token_ids for o in outs])
        if spec is not None:
            replays, mismatches, _ = llm.collective_rpc(_checks)[0]
            assert replays > 20 and mismatches == 0, (replays, mismatches)
        del llm
    assert runs[1] == runs[0]


def _check_captured_proposals(runner) -> None:
    """Compare each replay's drafts with the eager path's on the same step (counted,
    since an assertion inside the engine would only fail the request)."""
    drafter = runner.drafter
    graphs = drafter.proposal_graphs
    assert graphs is not None and graphs.graphs, "no proposal graphs were captured"
    run, counts = graphs.run, runner.__dict__.setdefault("_proposal_checks", [0, 0, set()])

    def checked(size, batch, input_ids, next_token_ids, num_accepted):
        drafts = run(size, batch, input_ids, next_token_ids, num_accepted)
        drafter.proposal_graphs = None
        try:
            eager = drafter.propose(batch, input_ids, next_token_ids, num_accepted)
        finally:
            drafter.proposal_graphs = graphs
        counts[0] += 1
        counts[1] += not torch.equal(drafts, eager)
        counts[2].add((size, len(batch.needs_sample)))
        return drafts

    graphs.run = checked
