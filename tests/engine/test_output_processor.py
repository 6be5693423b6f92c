"""The output side on its own: stop strings, the finished request's output, n > 1
aggregation and aborts, driven with hand-built requests and a real (tiny) tokenizer."""

from __future__ import annotations

from types import SimpleNamespace

import pytest
import transformers

from minivllm.core.sched_output import ScheduledRequest, SchedulerOutput
from minivllm.engine.output_processor import OutputProcessor
from minivllm.engine.parallel_sampling import ParentRequest
from minivllm.request import Request, RequestStatus
from minivllm.sampling_params import SamplingParams


@pytest.fixture(scope="module")
def tokenizer(model_dir):
    return transformers.AutoTokenizer.from_pretrained(str(model_dir))


def _request(rid: str, tokenizer, **params) -> Request:
    """A request the scheduler has admitted."""
    request = Request(rid, tokenizer.encode("once upon"), SamplingParams(max_tokens=20, **params))
    request.status = RequestStatus.RUNNING
    return request


def _sampled(*requests: Request) -> SchedulerOutput:
    """A step in which every request sampled one token."""
    scheduled = [ScheduledRequest(r, 1, r.num_tokens - 1, [], needs_sample=True) for r in requests]
    return SchedulerOutput(scheduled=scheduled)


def _append_text(request: Request, tokenizer, text: str) -> None:
    request.append_output_token_ids(tokenizer.encode(text))


def test_a_stop_string_returns_running_requests_and_marks_finished_ones(tokenizer) -> None:
    proc = OutputProcessor(tokenizer)
    running = _request("a", tokenizer, stop=["time"])
    finished = _request("b", tokenizer, stop=["time"])
    plain = _request("c", tokenizer)
    for r in (running, finished, plain):
        proc.add_request(r, None)
        _append_text(r, tokenizer, " a time there")
    finished.status = RequestStatus.FINISHED_LENGTH_CAPPED  # the scheduler finished it
    assert proc.apply_stop_strings(_sampled(running, finished, plain)) == [running]
    assert running.stop_reason == "time" and running.status == RequestStatus.RUNNING
    # A stop string found in a request the scheduler just finished wins.
    assert finished.get_finished_reason() == "stop" and finished.stop_reason == "time"
    out = proc.make_output(finished)
    assert out.outputs[0].text == " a " and out.outputs[0].finish_reason == "stop"
    assert "b" not in proc.detokenizers


def test_children_of_n_gather_into_one_output_and_abort_forgets(tokenizer) -> None:
    proc = OutputProcessor(tokenizer)
    params = SamplingParams(max_tokens=4, n=2)
    parent = ParentRequest("p", params)
    children = []
    for index in range(2):
        child_id, child_params = parent.get_child_info(index)
        child = Request(child_id, tokenizer.encode("hi"), child_params)
        proc.add_request(child, (parent, index))
        children.append(child)
    assert proc.is_child_of(children[0].request_id, {"p"})
    for child, text in zip(children, (" one", " two")):
        _append_text(child, tokenizer, text)
        child.status = RequestStatus.FINISHED_LENGTH_CAPPED
    assert proc.make_output(children[1]) is None  # its sibling is still running
    out = proc.make_output(children[0])
    assert out.request_id == "p" and [c.text for c in out.outputs] == [" one", " two"]
    assert not proc.parents and not proc.detokenizers

    other = _request("x", tokenizer, logprobs=1)
    proc.add_request(other, None)
    proc.abort_requests(["x"])
    assert not proc.detokenizers and not proc.logprobs


def test_without_a_tokenizer_outputs_carry_token_ids_only() -> None:
    proc = OutputProcessor(None)
    request = Request("t", [5, 6], SamplingParams(max_tokens=2))
    proc.add_request(request, None)
    request.append_output_token_ids([7, 8])
    request.status = RequestStatus.FINISHED_LENGTH_CAPPED
    out = proc.make_output(request)
    assert out.outputs[0].token_ids == [7, 8] and out.outputs[0].text == ""
    assert proc.apply_stop_strings(SimpleNamespace(sampling_requests=list)) == []
