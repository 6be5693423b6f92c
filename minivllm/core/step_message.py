"""The per-step message the engine sends every tensor-parallel worker.

Upstream counterparts: ``vllm/v1/core/sched/output.py`` (``NewRequestData``,
``CachedRequestData``: the scheduler's output as a *diff*) and the worker side that
applies it, ``GPUModelRunner._update_states`` in ``vllm/v1/worker/gpu_model_runner.py``.

In one process the model runner reads the scheduler's ``Request`` objects directly. A
worker process has no such objects, and sending them whole every step would copy every
request's full token list (hundreds of KiB per decode step of a large batch). So the
engine sends only what changed, and each worker keeps a *mirror* ``Request`` per live
request that it updates:

* a request the worker has never seen arrives once with its prompt and sampling
  parameters (``NewRequestData``);
* every step then carries, per scheduled request, the tokens appended since the last
  message (normally the one token sampled in the previous step) and the KV block ids
  allocated since then (all of them when the request was just (re)admitted);
* finished requests are named so the mirrors (and their seeded generators) are dropped;
* a request verifying drafts (speculative decoding) carries them, so every rank runs the
  same flat batch and the same rejection sampler (the same seeded generators, so the
  same decisions); the engine keeps rank 0's answer.

The worker rebuilds a ``SchedulerOutput`` over its mirrors and runs the very same
``ModelRunner.execute_model`` as the single-process engine.

The three types are ``msgspec.Struct``s encoded as arrays (no field names on the wire;
upstream's are dataclasses, pickled): the executor sends the message as msgpack
(``minivllm/executor/worker_messages.py``), and a decode step of 256 requests is a
few KiB.
"""

from __future__ import annotations

import msgspec

from minivllm.core.sched_output import ScheduledRequest, SchedulerOutput
from minivllm.request import Request
from minivllm.sampling_params import SamplingParams


class NewRequestData(msgspec.Struct, array_like=True, gc=False):
    """A request the workers have not seen yet: what never changes about it."""

    request_id: str
    prompt_token_ids: list[int]
    sampling_params: SamplingParams
    eos_token_id: int | None


class ScheduledRequestData(msgspec.Struct, array_like=True, gc=False):
    """One scheduled request of a step, as a diff against the worker's mirror.

    Attributes:
        request_id: Which mirror.
        num_scheduled_tokens: As ``ScheduledRequest``.
        num_computed_tokens: As ``ScheduledRequest`` (a snapshot at scheduling time).
        new_token_ids: Tokens appended to the request since the previous message.
        new_block_ids: Block ids to append to the mirror's list, or the whole list when
            ``replace_block_ids`` (a request admitted from the waiting queue).
        replace_block_ids: The request was (re)admitted: its old blocks are gone.
        is_new, is_resumed, needs_sample: As ``ScheduledRequest``.
        spec_token_ids: As ``ScheduledRequest``: the drafts every rank verifies this
            step (never part of the mirror's tokens; the accepted ones arrive with the
            next message's ``new_token_ids``).
    """

    request_id: str
    num_scheduled_tokens: int
    num_computed_tokens: int
    new_token_ids: list[int]
    new_block_ids: list[int]
    replace_block_ids: bool
    is_new: bool
    is_resumed: bool
    needs_sample: bool
    spec_token_ids: list[int] = msgspec.field(default_factory=list)


class StepMessage(msgspec.Struct, array_like=True, gc=False):
    """Everything a worker needs to run one step (the same message goes to every rank)."""

    new_requests: list[NewRequestData] = msgspec.field(default_factory=list)
    scheduled: list[ScheduledRequestData] = msgspec.field(default_factory=list)
    preempted_req_ids: set[str] = msgspec.field(default_factory=set)
    finished_req_ids: set[str] = msgspec.field(default_factory=set)


class StepMessageEncoder:
    """Engine side: turns each ``SchedulerOutput`` into a ``StepMessage`` diff.

    It remembers, per live request, how many tokens and block ids the workers already
    hold; that bookkeeping is all it needs, because a request's token list and (while
    it runs) its block list only ever grow.
    """

    def __init__(self) -> None:
        self._num_sent_tokens: dict[str, int] = {}
        self._num_sent_blocks: dict[str, int] = {}

    def encode(self, scheduler_output: SchedulerOutput) -> StepMessage:
        """The diff that brings the workers' mirrors up to ``scheduler_output``."""
        msg = StepMessage(
            preempted_req_ids=set(scheduler_output.preempted_req_ids),
            finished_req_ids=set(scheduler_output.finished_req_ids),
        )
        for req_id in scheduler_output.finished_req_ids:
            self._num_sent_tokens.pop(req_id, None)
            self._num_sent_blocks.pop(req_id, None)
        for s in scheduler_output.scheduled:
            msg.scheduled.append(self._encode_one(s, msg.new_requests))
        return msg

    def _encode_one(self, s: ScheduledRequest, new_requests: list[NewRequestData]) -> (
        ScheduledRequestData
    ):
        request, req_id = s.request, s.request_id
        if req_id not in self._num_sent_tokens:
            new_requests.append(
                NewRequestData(
                    req_id, request.prompt_token_ids, request.sampling_params,
                    request.eos_token_id,
                )
            )
            self._num_sent_tokens[req_id] = request.num_prompt_tokens
        sent = self._num_sent_tokens[req_id]
        self._num_sent_tokens[req_id] = request.num_tokens
        # A request admitted from the waiting queue got a fresh block list (after a
        # preemption the old one was freed); a running one only appended to its list.
        replace = s.is_new or req_id not in self._num_sent_blocks
        first_new_block = 0 if replace else self._num_sent_blocks[req_id]
        self._num_sent_blocks[req_id] = len(s.block_ids)
        return ScheduledRequestData(
            request_id=req_id,
            num_scheduled_tokens=s.num_scheduled_tokens,
            num_computed_tokens=s.num_computed_tokens,
            new_token_ids=request.all_token_ids[sent:],
            new_block_ids=s.block_ids[first_new_block:],
            replace_block_ids=replace,
            is_new=s.is_new,
            is_resumed=s.is_resumed,
            needs_sample=s.needs_sample,
            spec_token_ids=s.spec_token_ids,
        )


class RequestMirror:
    """Worker side: the live requests as the worker knows them, and the decoder."""

    def __init__(self) -> None:
        self.requests: dict[str, Request] = {}
        self.block_ids: dict[str, list[int]] = {}

    def decode(self, msg: StepMessage) -> SchedulerOutput:
        """Apply the diff and return the ``SchedulerOutput`` the engine scheduled."""
        for req_id in msg.finished_req_ids:
            self.requests.pop(req_id, None)
            self.block_ids.pop(req_id, None)
        for new in msg.new_requests:
            self.requests[new.request_id] = Request(
                new.request_id, new.prompt_token_ids, new.sampling_params, new.eos_token_id,
                arrival_time=0.0,
            )
        out = SchedulerOutput(
            preempted_req_ids=msg.preempted_req_ids, finished_req_ids=msg.finished_req_ids
        )
        for d in msg.scheduled:
            request = self.requests[d.request_id]
            if d.new_token_ids:
                request.append_output_token_ids(d.new_token_ids)
            if d.replace_block_ids:
                self.block_ids[d.request_id] = list(d.new_block_ids)
            else:
                self.block_ids[d.request_id].extend(d.new_block_ids)
            out.scheduled.append(
                ScheduledRequest(
                    request=request,
                    num_scheduled_tokens=d.num_scheduled_tokens,
                    num_computed_tokens=d.num_computed_tokens,
                    block_ids=self.block_ids[d.request_id],
                    is_new=d.is_new,
                    is_resumed=d.is_resumed,
                    needs_sample=d.needs_sample,
                    spec_token_ids=d.spec_token_ids,
                )
            )
            out.num_scheduled_tokens[d.request_id] = d.num_scheduled_tokens
            out.total_num_scheduled_tokens += d.num_scheduled_tokens
        return out
