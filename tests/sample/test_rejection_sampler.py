"""The rejection sampler: greedy cases by hand, the output distribution, seeds, logprobs.

The statistical tests run one experiment: many copies of one request, each with its own
drafts drawn from ``q``, verified in one batch against fixed target logits per position.
Among the copies that emitted more than ``j`` tokens, token ``j`` must follow the
target's distribution at position ``j``, whatever ``q`` is; a chi-square test with fixed
seeds checks it. Negative controls show the test can tell a broken sampler: the same
experiment with the residual left unnormalized (under a draw that needs it normalized),
or with the residual replaced by ``p``, is rejected.
"""

from __future__ import annotations

import pytest
import torch

import minivllm.sample.rejection_sampler as rs_module
from minivllm.request import Request
from minivllm.sample.metadata import SamplingMetadata
from minivllm.sample.rejection_sampler import (
    PLACEHOLDER_TOKEN_ID,
    RejectionSampler,
    requests_at_sampled_rows,
)
from minivllm.sample.sampler import Sampler
from minivllm.sampling_params import SamplingParams
from minivllm.spec_decode.metadata import SpecDecodeMetadata
from tests.sample.reference import chi_square_pvalue, target_distribution

CPU = torch.device("cpu")
VOCAB = 8
EOS = 1


def greedy_logits(argmax_per_row: list[int]) -> torch.Tensor:
    """Logits whose argmax at sampled row ``r`` is ``argmax_per_row[r]``."""
    logits = torch.zeros(len(argmax_per_row), VOCAB)
    logits[torch.arange(len(argmax_per_row)), torch.tensor(argmax_per_row)] = 5.0
    return logits


def run_greedy(drafts: list[list[int]], argmax_per_row: list[int]) -> list[list[int]]:
    metadata = SpecDecodeMetadata.from_draft_token_ids(drafts, CPU)
    md = SamplingMetadata(temperature=None, all_greedy=True, all_random=False)
    out = RejectionSampler(Sampler())(metadata, None, greedy_logits(argmax_per_row), md)
    assert out.sampled_token_ids.shape == (len(drafts), metadata.max_spec_len + 1)
    return RejectionSampler.parse_output(out.sampled_token_ids)[0]


# (drafts per request, target argmax per sampled row, expected output per request)
GREEDY_CASES = {
    "all accepted, then the bonus": ([[1, 2, 3]], [1, 2, 3, 4], [[1, 2, 3, 4]]),
    "first rejected": ([[1, 2, 3]], [5, 2, 3, 4], [[5]]),
    "second rejected": ([[1, 2, 3]], [1, 6, 3, 4], [[1, 6]]),
    "last rejected": ([[1, 2, 3]], [1, 2, 7, 4], [[1, 2, 7]]),
    "rejection is final: a later match counts for nothing": (
        [[1, 2, 3]],
        [1, 0, 3, 4],
        [[1, 0]],
    ),
    "no drafts: the plain decode token": ([[]], [6], [[6]]),
    "mixed batch with 0..3 drafts": (
        [[], [2], [3, 4], [5, 6, 7], [1, 1]],
        [0, 2, 3, 3, 4, 0, 5, 6, 7, 2, 1, 5, 1],
        [[0], [2, 3], [3, 4, 0], [5, 6, 7, 2], [1, 5]],
    ),
}


@pytest.mark.parametrize("case", GREEDY_CASES)
def test_greedy_by_hand(case: str) -> None:
    drafts, argmax_per_row, expected = GREEDY_CASES[case]
    assert run_greedy(drafts, argmax_per_row) == expected


def test_greedy_rows_of_a_random_batch_stay_greedy() -> None:
    # Request 0 greedy, request 1 random with a target that puts all mass on one token.
    drafts = [[1, 2], [3]]
    logits = greedy_logits([1, 5, 0, 3, 4]) * 20  # softmax is a point mass at each row
    metadata = SpecDecodeMetadata.from_draft_token_ids(drafts, CPU)
    md = SamplingMetadata(
        temperature=torch.tensor([0.0, 0.0, 0.0, 1.0, 1.0]), all_greedy=False, all_random=False
    )
    out = RejectionSampler(Sampler(torch.Generator().manual_seed(0)))(metadata, None, logits, md)
    assert RejectionSampler.parse_output(out.sampled_token_ids)[0] == [[1, 5], [3, 4]]


def make_request(
    params: SamplingParams, prompt: list[int], output: list[int], request_id: str = "r"
) -> Request:
    params.update_from_generation_config({EOS})
    request = Request(request_id, prompt, params, eos_token_id=EOS)
    request.append_output_token_ids(output)
    return request


def test_each_row_sees_the_drafts_before_it_as_generated() -> None:
    """min_tokens and penalties at row j count the first j drafts as outputs."""
    # One output so far, min_tokens=3: EOS is forbidden at rows 0 and 1, allowed from 2.
    request = make_request(SamplingParams(temperature=0.0, min_tokens=3), [4, 4], [2])
    drafts = [[5, 5, EOS]]
    logits = torch.zeros(4, VOCAB)
    logits[:, EOS], logits[:, 5] = 9.0, 8.0  # EOS first, 5 second, at every row
    rows = requests_at_sampled_rows([request], drafts)
    md = SamplingMetadata.from_requests(rows, CPU, {}, VOCAB)
    metadata = SpecDecodeMetadata.from_draft_token_ids(drafts, CPU)
    out = RejectionSampler(Sampler())(metadata, None, logits, md)
    # Counting only the real output would forbid EOS at row 2 and reject the third draft.
    assert RejectionSampler.parse_output(out.sampled_token_ids)[0] == [[5, 5, EOS, EOS]]

    # Penalties: each row's distribution is the reference's with outputs + drafts[:j].
    params = SamplingParams(
        temperature=0.8, repetition_penalty=1.4, frequency_penalty=0.5, presence_penalty=0.3
    )
    request = make_request(params, [0, 3], [3, 6])
    drafts = [[6, 2, 2]]
    logits = torch.randn(4, VOCAB, generator=torch.Generator().manual_seed(3))
    md = SamplingMetadata.from_requests(requests_at_sampled_rows([request], drafts), CPU, {}, VOCAB)
    processed = Sampler.apply_logits_processors(logits.clone(), md)
    probs = Sampler().compute_probs(processed, md)
    for j in range(4):
        expected = target_distribution(logits[j], params, [0, 3], [3, 6, *drafts[0][:j]])
        torch.testing.assert_close(probs[j].double(), expected, atol=1e-6, rtol=0)


# ---- the output distribution ------------------------------------------------------

DRAWS = 20_000
K = 3
ALPHA = 1e-3
# Target logits per sampled row (K draft rows and the bonus row), and the draft model's q
# per draft row: fixed, well spread, and different from each other.
_g = torch.Generator().manual_seed(1234)
TARGET_LOGITS = torch.randn(K + 1, VOCAB, generator=_g)
DRAFT_PROBS = torch.softmax(torch.randn(K, VOCAB, generator=_g) * 1.5, dim=-1)


def emitted_tokens(params: SamplingParams, draft_probs: torch.Tensor | None) -> torch.Tensor:
    """DRAWS copies of one request verifying K drafts: ``[DRAWS, K + 1]`` output grid.

    With ``draft_probs`` each copy's drafts are drawn from them; without (n-gram), every
    copy proposes the same drafts: the target's most likely token at each position, so
    that enough copies get far enough to test every position.
    """
    g = torch.Generator().manual_seed(0)
    if draft_probs is None:
        drafts = TARGET_LOGITS[:K].argmax(dim=-1).expand(DRAWS, K)
    else:
        columns = [torch.multinomial(q, DRAWS, replacement=True, generator=g) for q in draft_probs]
        drafts = torch.stack(columns, dim=1)
    metadata = SpecDecodeMetadata.from_draft_token_ids(drafts.tolist(), CPU)
    # One copy's K + 1 rows through from_requests, then tiled (the copies are identical).
    one = SamplingMetadata.from_requests(
        requests_at_sampled_rows([Request("r", [0], params)], [[0] * K]), CPU, {}, VOCAB
    )
    md = SamplingMetadata(
        temperature=one.temperature.repeat(DRAWS),
        all_greedy=False,
        all_random=True,
        top_k=None if one.top_k is None else one.top_k.repeat(DRAWS),
        top_p=None if one.top_p is None else one.top_p.repeat(DRAWS),
    )
    flat_q = None if draft_probs is None else draft_probs.repeat(DRAWS, 1)
    sampler = RejectionSampler(Sampler(torch.Generator().manual_seed(1)))
    return sampler(metadata, flat_q, TARGET_LOGITS.repeat(DRAWS, 1), md).sampled_token_ids


def position_pvalues(params: SamplingParams, draft_probs: torch.Tensor | None) -> list[float]:
    """Per position j: chi-square p-value of token j (where emitted) against p_j."""
    grid = emitted_tokens(params, draft_probs)
    pvalues = []
    for j in range(K + 1):
        at_j = grid[:, j][grid[:, j] != PLACEHOLDER_TOKEN_ID]
        assert at_j.numel() > 300, f"too few copies reach position {j} to test it"
        counts = torch.bincount(at_j, minlength=VOCAB)
        pvalues.append(chi_square_pvalue(counts, target_distribution(TARGET_LOGITS[j], params)))
    return pvalues


PARAMS = {
    "plain": SamplingParams(temperature=1.0),
    "temperature, top-k, top-p": SamplingParams(temperature=0.7, top_k=6, top_p=0.95),
}


@pytest.mark.parametrize("draft", ["draft model", "n-gram"])
@pytest.mark.parametrize("params", PARAMS)
def test_output_follows_the_target_distribution(params: str, draft: str) -> None:
    draft_probs = DRAFT_PROBS if draft == "draft model" else None
    pvalues = position_pvalues(PARAMS[params], draft_probs)
    assert min(pvalues) > ALPHA, pvalues


def inverse_cdf_sample(
    probs: torch.Tensor,
    generators: dict[int, torch.Generator],
    default_generator: torch.Generator | None = None,
    *,
    renormalize: bool,
) -> torch.Tensor:
    """The textbook draw, one uniform per row and a search in the cumulative sum.

    Unlike the exponential race it needs a normalized input: a residual that sums to
    less than 1 leaves the remaining mass to whatever the search clamps to (the last
    token). A test-only stand-in for ``random_sample``.
    """
    if renormalize:
        probs = probs / probs.sum(dim=-1, keepdim=True)
    u = torch.rand(probs.shape[0], 1, dtype=probs.dtype, generator=default_generator)
    index = torch.searchsorted(probs.cumsum(dim=-1), u, right=True).squeeze(1)
    return index.clamp(max=probs.shape[1] - 1)


def test_negative_controls_fail(monkeypatch: pytest.MonkeyPatch) -> None:
    """The chi-square test catches a sampler that does not renormalize the residual."""
    params = PARAMS["plain"]

    def draw(renormalize: bool):
        return lambda probs, gens, default=None: inverse_cdf_sample(
            probs, gens, default, renormalize=renormalize
        )

    # The same draw with the residual normalized passes: normalization is the difference.
    monkeypatch.setattr(rs_module, "random_sample", draw(renormalize=True))
    assert min(position_pvalues(params, DRAFT_PROBS)) > ALPHA
    monkeypatch.setattr(rs_module, "random_sample", draw(renormalize=False))
    for draft_probs in (DRAFT_PROBS, None):
        pvalues = position_pvalues(params, draft_probs)
        # Every position with a draft resamples from the residual, and each fails.
        assert max(pvalues[:K]) < 1e-12, pvalues
    monkeypatch.undo()

    # Resampling from p itself instead of the residual is biased towards the drafts.
    monkeypatch.setattr(rs_module, "residual_probs", lambda target, q, drafts: target)
    assert max(position_pvalues(params, DRAFT_PROBS)[:K]) < 1e-12


def test_a_draft_its_model_gave_zero_probability_is_rejected() -> None:
    drafts = [[3]]
    q = torch.full((1, VOCAB), 1.0 / (VOCAB - 1))
    q[0, 3] = 0.0
    logits = greedy_logits([3, 0]) * 20  # the target is sure of token 3
    metadata = SpecDecodeMetadata.from_draft_token_ids(drafts, CPU)
    md = SamplingMetadata(temperature=torch.ones(2), all_greedy=False, all_random=True)
    out = RejectionSampler(Sampler(torch.Generator().manual_seed(0)))(metadata, q, logits, md)
    # Rejected, then drawn from the residual max(0, p - q) = p: token 3 after all.
    assert RejectionSampler.parse_output(out.sampled_token_ids)[0] == [[3]]


# ---- seeds and logprobs -----------------------------------------------------------


def seeded_batch_output(seeded_first: bool, neighbours: int) -> list[int]:
    """The seeded request's tokens, in a batch with unseeded neighbours."""
    drafts_seeded = [[2, 5, 1]]
    requests = [make_request(SamplingParams(temperature=1.0, seed=7), [3], [])]
    drafts = drafts_seeded
    for i in range(neighbours):
        requests.append(make_request(SamplingParams(temperature=1.0), [i], [], f"n{i}"))
        drafts = [*drafts, [i % VOCAB] * (i % 3)]
    if not seeded_first:
        requests, drafts = requests[::-1], drafts[::-1]
    logits_g = torch.Generator().manual_seed(5)
    rows = requests_at_sampled_rows(requests, drafts)
    logits = torch.randn(len(rows), VOCAB, generator=logits_g)
    seeded_index = 0 if seeded_first else len(requests) - 1
    # The seeded request's rows get the same logits wherever it sits.
    start = sum(len(d) + 1 for d in drafts[:seeded_index])
    logits[start : start + 4] = torch.randn(4, VOCAB, generator=torch.Generator().manual_seed(9))
    generators = {"r": torch.Generator().manual_seed(7)}
    md = SamplingMetadata.from_requests(rows, CPU, generators, VOCAB)
    metadata = SpecDecodeMetadata.from_draft_token_ids(drafts, CPU)
    sampler = RejectionSampler(Sampler(torch.Generator().manual_seed(len(requests))))
    out = sampler(metadata, None, logits, md)
    return RejectionSampler.parse_output(out.sampled_token_ids)[0][seeded_index]


def test_seeded_request_is_deterministic_and_independent_of_its_batch() -> None:
    alone = seeded_batch_output(seeded_first=True, neighbours=0)
    assert seeded_batch_output(seeded_first=True, neighbours=0) == alone
    assert seeded_batch_output(seeded_first=True, neighbours=5) == alone
    assert seeded_batch_output(seeded_first=False, neighbours=7) == alone


def test_logprobs_are_the_raw_logprobs_of_the_emitted_tokens() -> None:
    drafts = [[1, 2], [], [4]]
    logits = torch.randn(6, VOCAB, generator=torch.Generator().manual_seed(2))
    logits[0, 1] = logits[1, 3] = 20.0  # request 0: accept draft 1, reject 2 for 3
    metadata = SpecDecodeMetadata.from_draft_token_ids(drafts, CPU)
    params = SamplingParams(temperature=0.0, logprobs=2)
    requests = [Request(str(i), [0], params) for i in range(3)]
    md = SamplingMetadata.from_requests(requests_at_sampled_rows(requests, drafts), CPU, {}, VOCAB)
    out = RejectionSampler(Sampler())(metadata, None, logits, md)
    tokens, logprobs = RejectionSampler.parse_output(out.sampled_token_ids, out.logprobs_tensors)
    assert tokens[0] == [1, 3]
    assert logprobs is not None
    assert logprobs.cu_num_generated_tokens == [0, 2, 3, 3 + len(tokens[2])]
    # The sampled row behind each emitted token: request 0 rows 0, 1; 1 row 3; 2 rows 4, 5.
    rows = [0, 1, 3] + [4, 5][: len(tokens[2])]
    flat = [t for ts in tokens for t in ts]
    assert logprobs is not None and len(logprobs.token_ids) == len(flat)
    raw = logits.log_softmax(dim=-1)
    for i, (row, token) in enumerate(zip(rows, flat)):
        assert logprobs.token_ids[i][0] == token
        assert logprobs.logprobs[i][0] == pytest.approx(raw[row, token].item(), abs=1e-5)
        assert logprobs.token_ids[i][1:] == raw[row].topk(2).indices.tolist()


def test_placeholder_fills_after_the_last_token() -> None:
    metadata = SpecDecodeMetadata.from_draft_token_ids([[1, 2, 3], [4]], CPU)
    md = SamplingMetadata(temperature=None, all_greedy=True, all_random=False)
    out = RejectionSampler(Sampler())(metadata, None, greedy_logits([0, 0, 0, 0, 4, 6]), md)
    assert out.sampled_token_ids.tolist() == [
        [0, PLACEHOLDER_TOKEN_ID, PLACEHOLDER_TOKEN_ID, PLACEHOLDER_TOKEN_ID],
        [4, 6, PLACEHOLDER_TOKEN_ID, PLACEHOLDER_TOKEN_ID],
    ]


def test_last_tokens_split_the_grid_per_request() -> None:
    drafts = [[1, 2, 3], [], [4, 5]]
    # Request 0 accepts 1 and 2 then gets 6; request 1 decodes 3; request 2 accepts both.
    argmax = [1, 2, 6, 0, 3, 4, 5, 7]
    metadata = SpecDecodeMetadata.from_draft_token_ids(drafts, CPU)
    params = SamplingParams(temperature=0.0, logprobs=0)
    requests = [Request(str(i), [0], params) for i in range(3)]
    md = SamplingMetadata.from_requests(requests_at_sampled_rows(requests, drafts), CPU, {}, VOCAB)
    logits = greedy_logits(argmax)
    out = RejectionSampler(Sampler())(metadata, None, logits, md)
    last, num_accepted, logprobs = RejectionSampler.last_tokens(out)
    assert last.tolist() == [6, 3, 7] and num_accepted.tolist() == [2, 0, 2]
    assert logprobs is not None
    lists = logprobs.tolists()
    raw = logits.log_softmax(dim=-1)
    # Each request's run, token by token, with the sampled row that scored each token.
    runs = {0: ([1, 2, 6], [0, 1, 2]), 1: ([3], [4]), 2: ([4, 5, 7], [5, 6, 7])}
    for i, (tokens, rows) in runs.items():
        mine = lists.slice_request(i, len(tokens))
        assert [ids[0] for ids in mine.token_ids] == tokens
        expected = [raw[r, t].item() for r, t in zip(rows, tokens)]
        assert [lp[0] for lp in mine.logprobs] == pytest.approx(expected, abs=1e-6)
    # A stop rule that keeps only the first token of request 2's run.
    assert lists.slice_request(2, 1).token_ids == [[4]]


def test_a_request_with_a_non_finite_row_is_flagged_alone() -> None:
    drafts = [[1, 2], [3], []]
    metadata = SpecDecodeMetadata.from_draft_token_ids(drafts, CPU)
    logits = greedy_logits([1, 2, 0, 3, 4, 5])
    logits[1, 4] = float("nan")  # request 0's second draft row
    logits[5] = float("-inf")  # request 2's only row: nothing can be sampled
    md = SamplingMetadata(temperature=None, all_greedy=True, all_random=False)
    out = RejectionSampler(Sampler())(metadata, None, logits, md)
    assert out.logits_finite is not None
    assert out.logits_finite.tolist() == [False, True, False]
    # The healthy request's tokens are what they would be alone.
    assert RejectionSampler.parse_output(out.sampled_token_ids)[0][1] == [3, 4]
