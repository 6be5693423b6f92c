"""The output side on its own: core outputs in, ``RequestOutput``s out.

Driven with hand-built ``EngineCoreOutput``s (what the engine core sends each step) and a
real (tiny) tokenizer: stop strings and the aborts they cause, the three output kinds,
n > 1 aggregation, and text that does not depend on how it was produced.
"""

from __future__ import annotations

import asyncio

import pytest
import transformers

from minivllm.engine import EngineCoreOutput, EngineCoreRequest, FinishReason
from minivllm.engine.output_processor import OutputProcessor, RequestOutputCollector
from minivllm.engine.parallel_sampling import ParentRequest
from minivllm.runner_outputs import LogprobsLists
from minivllm.sampling_params import RequestOutputKind, SamplingParams

FINAL, DELTA, CUMULATIVE = (
    RequestOutputKind.FINAL_ONLY,
    RequestOutputKind.DELTA,
    RequestOutputKind.CUMULATIVE,
)


@pytest.fixture(scope="module")
def tokenizer(model_dir):
    return transformers.AutoTokenizer.from_pretrained(str(model_dir))


def _request(rid: str, tokenizer, **params) -> EngineCoreRequest:
    params.setdefault("max_tokens", 50)
    ids = tokenizer.encode("once upon") if tokenizer is not None else [5, 6]
    return EngineCoreRequest(rid, ids, SamplingParams(**params), None, 0.0)


def _steps(proc: OutputProcessor, rid: str, token_ids: list[int], finish=None):
    """Feed one token per step; return every step's processor output."""
    results = []
    for i, tok in enumerate(token_ids):
        last = i == len(token_ids) - 1
        out = EngineCoreOutput(rid, [tok], finish_reason=finish if last else None)
        results.append(proc.process_outputs([out], engine_core_timestamp=float(i)))
    return results


def _text_ids(tokenizer, text: str) -> list[int]:
    return tokenizer.encode(text)


def test_a_stop_string_ends_the_request_and_asks_the_core_to_abort_it(tokenizer) -> None:
    proc = OutputProcessor(tokenizer)
    proc.add_request(_request("a", tokenizer, stop=["time"], output_kind=FINAL), None)
    results = _steps(proc, "a", _text_ids(tokenizer, " a time there"))
    aborts = [rid for r in results for rid in r.reqs_to_abort]
    (out,) = [o for r in results for o in r.request_outputs]
    assert aborts == ["a"]
    assert out.finished and out.outputs[0].text == " a "
    assert (out.outputs[0].finish_reason, out.outputs[0].stop_reason) == ("stop", "time")
    assert not proc.has_unfinished_requests()


def test_a_stop_string_in_a_request_the_core_finished_wins_without_an_abort(tokenizer) -> None:
    proc = OutputProcessor(tokenizer)
    proc.add_request(_request("b", tokenizer, stop=["time"], output_kind=FINAL), None)
    results = _steps(proc, "b", _text_ids(tokenizer, " a time"), finish=FinishReason.LENGTH)
    assert not any(r.reqs_to_abort for r in results)
    out = results[-1].request_outputs[0]
    assert (out.outputs[0].finish_reason, out.outputs[0].stop_reason) == ("stop", "time")


@pytest.mark.parametrize("stop", [None, ["zzz"]])
def test_delta_outputs_join_to_the_final_text(tokenizer, stop) -> None:
    ids = _text_ids(tokenizer, " in the beginning was the word")
    final = OutputProcessor(tokenizer)
    final.add_request(_request("f", tokenizer, output_kind=FINAL, stop=stop), None)
    (expected,) = _steps(final, "f", ids, FinishReason.LENGTH)[-1].request_outputs
    stream = OutputProcessor(tokenizer)
    stream.add_request(_request("s", tokenizer, output_kind=DELTA, stop=stop), None)
    deltas = [o for r in _steps(stream, "s", ids, FinishReason.LENGTH) for o in r.request_outputs]
    assert len(deltas) == len(ids)
    assert "".join(d.outputs[0].text for d in deltas) == expected.outputs[0].text
    assert [t for d in deltas for t in d.outputs[0].token_ids] == ids
    assert [d.finished for d in deltas] == [False] * (len(ids) - 1) + [True]


@pytest.mark.parametrize("interval", [2, 3, 100])
@pytest.mark.parametrize("logprobs", [None, 1])
def test_a_stream_interval_sends_every_nth_token_and_loses_none(
    tokenizer, interval, logprobs
) -> None:
    ids = _text_ids(tokenizer, " in the beginning was the word and the word was")
    every = OutputProcessor(tokenizer)
    every.add_request(_request("e", tokenizer, output_kind=DELTA, logprobs=logprobs), None)
    sparse = OutputProcessor(tokenizer, stream_interval=interval)
    sparse.add_request(_request("s", tokenizer, output_kind=DELTA, logprobs=logprobs), None)
    outs = {}
    for name, proc in (("e", every), ("s", sparse)):
        steps = []
        for i, tok in enumerate(ids):
            finish = FinishReason.LENGTH if i == len(ids) - 1 else None
            rows = None
            if logprobs is not None:  # the sampled token and one more, as a step sends
                rows = LogprobsLists([[tok, tok + 1]], [[-0.5 - i, -2.0]], [1])
            out = EngineCoreOutput(name, [tok], new_logprobs=rows, finish_reason=finish)
            steps.append(proc.process_outputs([out], float(i)))
        outs[name] = [(i, o) for i, r in enumerate(steps) for o in r.request_outputs]
    # The first token at once, then one output per `interval` tokens, and the last.
    sent_at = [i for i, _ in outs["s"]]
    expected = sorted({0, *range(interval, len(ids), interval), len(ids) - 1})
    assert sent_at == expected
    # Nothing lost or repeated: the deltas join to the every-step stream's tokens, text
    # and logprobs, and only the last output is finished.
    for field in ("token_ids", "text", "logprobs"):
        joined = [getattr(o.outputs[0], field) for _, o in outs["s"]]
        full = [getattr(o.outputs[0], field) for _, o in outs["e"]]
        if field == "text":
            assert "".join(joined) == "".join(full)
        elif logprobs is not None or field == "token_ids":
            assert [x for part in joined for x in part] == [x for part in full for x in part]
    assert [o.finished for _, o in outs["s"]] == [False] * (len(sent_at) - 1) + [True]


def test_a_stream_interval_leaves_final_only_and_cumulative_outputs_whole(tokenizer) -> None:
    ids = _text_ids(tokenizer, " one two three four five")
    proc = OutputProcessor(tokenizer, stream_interval=2)
    proc.add_request(_request("f", tokenizer, output_kind=FINAL), None)
    proc.add_request(_request("c", tokenizer, output_kind=CUMULATIVE), None)
    final = _steps(proc, "f", ids, FinishReason.LENGTH)
    cumulative = _steps(proc, "c", ids, FinishReason.LENGTH)
    assert [len(r.request_outputs) for r in final] == [0] * (len(ids) - 1) + [1]
    outs = [o for r in cumulative for o in r.request_outputs]
    sent_at = sorted({*range(0, len(ids), 2), len(ids) - 1})
    assert [o.outputs[0].token_ids for o in outs] == [ids[: i + 1] for i in sent_at]
    assert final[-1].request_outputs[0].outputs[0].text == outs[-1].outputs[0].text


def test_a_stop_string_split_across_steps_never_leaks_into_a_delta(tokenizer) -> None:
    proc = OutputProcessor(tokenizer)
    proc.add_request(_request("d", tokenizer, stop=["the end"], output_kind=DELTA), None)
    ids = _text_ids(tokenizer, " so it was the end of it")
    streamed = "".join(o.outputs[0].text for r in _steps(proc, "d", ids) for o in r.request_outputs)
    assert streamed == " so it was "


def test_cumulative_outputs_grow(tokenizer) -> None:
    proc = OutputProcessor(tokenizer)
    proc.add_request(_request("c", tokenizer, output_kind=CUMULATIVE), None)
    ids = _text_ids(tokenizer, " one two three")
    outs = [o for r in _steps(proc, "c", ids, FinishReason.LENGTH) for o in r.request_outputs]
    assert [o.outputs[0].token_ids for o in outs] == [ids[: i + 1] for i in range(len(ids))]
    texts = [o.outputs[0].text for o in outs]
    assert all(b.startswith(a) for a, b in zip(texts, texts[1:]))


def test_text_ending_in_a_split_character_does_not_depend_on_stop_strings(tokenizer) -> None:
    # A multi-byte character cut after its first token: both paths show U+FFFD, as a
    # one-shot decode of the ids does.
    ids = _text_ids(tokenizer, " caf\u00e9 \U0001f600")
    cut = ids[:-1]
    assert tokenizer.decode(cut).endswith("\ufffd"), "the fixture must split a character"
    texts = []
    for stop in (None, ["zzz"]):
        proc = OutputProcessor(tokenizer)
        proc.add_request(_request("u", tokenizer, output_kind=FINAL, stop=stop), None)
        texts.append(_steps(proc, "u", cut, FinishReason.LENGTH)[-1].request_outputs[0])
    assert texts[0].outputs[0].text == texts[1].outputs[0].text
    assert texts[0].outputs[0].text.endswith("\ufffd")


def test_children_of_n_gather_into_one_output_and_abort_forgets(tokenizer) -> None:
    proc = OutputProcessor(tokenizer)
    request = _request("p", tokenizer, max_tokens=4, n=2, temperature=1.0, output_kind=FINAL)
    parent = ParentRequest("p", request.sampling_params)
    for index in range(2):
        child_id, child_params = parent.get_child_info(index)
        child = EngineCoreRequest(child_id, request.prompt_token_ids, child_params, None, 0.0)
        proc.add_request(child, "once upon", parent, index)
    one, two = _text_ids(tokenizer, " one"), _text_ids(tokenizer, " two")
    assert not _steps(proc, "1_p", two, FinishReason.LENGTH)[-1].request_outputs
    (out,) = _steps(proc, "0_p", one, FinishReason.LENGTH)[-1].request_outputs
    assert out.request_id == "p" and [c.text for c in out.outputs] == [" one", " two"]
    assert [c.index for c in out.outputs] == [0, 1] and out.finished
    assert not proc.has_unfinished_requests()

    parent = ParentRequest("q", request.sampling_params)
    for index in range(2):
        child_id, child_params = parent.get_child_info(index)
        child = EngineCoreRequest(child_id, request.prompt_token_ids, child_params, None, 0.0)
        proc.add_request(child, None, parent, index)
    assert sorted(proc.abort_requests(["q"])) == ["0_q", "1_q"]
    assert not proc.has_unfinished_requests()


def test_without_a_tokenizer_outputs_carry_token_ids_only() -> None:
    proc = OutputProcessor(None)
    proc.add_request(_request("t", None, max_tokens=2, output_kind=FINAL), None)
    (out,) = _steps(proc, "t", [7, 8], FinishReason.LENGTH)[-1].request_outputs
    assert out.outputs[0].token_ids == [7, 8] and out.outputs[0].text == ""


def test_metrics_follow_the_core_timestamps(tokenizer) -> None:
    proc = OutputProcessor(tokenizer)
    proc.add_request(_request("m", tokenizer, output_kind=FINAL), None)
    (out,) = _steps(proc, "m", [5, 6, 7], FinishReason.LENGTH)[-1].request_outputs
    m = out.metrics
    assert (m.first_token_ts, m.last_token_ts, m.num_generation_tokens) == (0.0, 2.0, 3)
    assert m.decode_time == 2.0 and m.mean_time_per_output_token == 1.0
    assert m.e2e_latency > 0


def test_a_collector_merges_unread_deltas(tokenizer) -> None:
    proc = OutputProcessor(tokenizer)
    queue = RequestOutputCollector(DELTA)
    proc.add_request(_request("q", tokenizer, output_kind=DELTA), None, queue=queue)
    ids = _text_ids(tokenizer, " and the light")
    _steps(proc, "q", ids, FinishReason.LENGTH)  # nobody reads in between
    merged = asyncio.run(queue.get())
    assert merged.outputs[0].token_ids == ids and merged.finished
    assert merged.outputs[0].text == tokenizer.decode(ids)
