"""Speculative decoding in the engine core: who proposes the next step's drafts, after
which steps, and how they reach the scheduler.

Upstream counterpart: the speculative-decoding parts of ``EngineCore`` in
``vllm/v1/engine/core.py``: ``post_step`` (the drafts a step proposed, taken from the
executor and given to ``Scheduler.update_draft_token_ids``) and, in
``step_with_batch_queue``, ``Scheduler.update_draft_token_ids_in_output`` (the drafts
written into the step already queued). Upstream's n-gram proposer runs in the worker
(``GPUModelRunner.propose_draft_token_ids``); minivllm's runs here, on the host, since it
needs only the token ids, which the engine core has.

``EngineCore`` holds one ``EngineDrafter`` when speculation is on and asks it two things:
after a step's tokens are applied, propose (``after_step``); and, with async scheduling,
whether a step must finish before the next is scheduled (``needs_settling``). Everything
else about drafts is the scheduler's (``core/sched_spec_decode.py``,
``core/sched_async_spec.py``) or the model runner's.
"""

from __future__ import annotations

import logging

from minivllm.config import SpeculativeConfig
from minivllm.core.sched_async_spec import DRAFT_PLACEHOLDER
from minivllm.core.sched_interface import SchedulerInterface
from minivllm.core.sched_output import SchedulerOutput
from minivllm.runner_outputs import ModelRunnerOutput
from minivllm.spec_decode.ngram_proposer import NgramProposer

logger = logging.getLogger(__name__)


class EngineDrafter:
    """Proposes drafts between steps (the n-gram proposer's, or those the draft model
    proposed on the device) and hands them to the scheduler.

    Args:
        spec: The speculative configuration (``method``, ``k``, ``disable_by_batch_size``).
        scheduler: The scheduler whose running requests get the drafts.
        max_model_len: The longest sequence; the n-gram proposer never drafts past it.
        async_scheduling: Whether the core keeps a step in flight (for the start-up log).

    Attributes:
        ngram: The n-gram proposer, or None with a draft model (whose drafts come back
            with each step's output).
    """

    def __init__(
        self,
        spec: SpeculativeConfig,
        scheduler: SchedulerInterface,
        max_model_len: int,
        async_scheduling: bool,
    ) -> None:
        self.spec = spec
        self.scheduler = scheduler
        self.ngram: NgramProposer | None = None
        if spec.method == "ngram":
            self.ngram = NgramProposer(
                spec.num_speculative_tokens,
                spec.prompt_lookup_min,
                spec.prompt_lookup_max,
                max_model_len,
            )
        logger.info(
            "speculative decoding: %s, up to %d draft tokens per request and step "
            "(verification steps replay CUDA graphs; requests with logprobs get one "
            "row per kept token; %s)",
            spec.method,
            spec.num_speculative_tokens,
            _async_note(spec, async_scheduling),
        )

    def after_step(
        self,
        scheduler_output: SchedulerOutput,
        runner_output: ModelRunnerOutput,
        in_flight: SchedulerOutput | None,
    ) -> None:
        """Drafts for the next step, once a step's tokens are applied.

        Only after a step small enough to speculate
        (``SpeculativeConfig.disable_by_batch_size``). The n-gram proposer needs every
        token known (``in_flight`` None: nothing queued behind this step); a draft
        model's drafts for the requests of the step in flight are already on the
        device, and their values are written into that step here.
        """
        if not self.spec.speculates_at(len(scheduler_output.scheduled)):
            return
        if in_flight is None or self.ngram is None:
            self.propose_drafts(runner_output)
        if in_flight is not None:
            _fill_drafts_in_flight(in_flight, runner_output)

    def needs_settling(self, scheduler_output: SchedulerOutput) -> bool:
        """Whether a step queued ahead must be processed before the next is scheduled.

        Speculation with ``disable_by_batch_size`` runs ahead (async scheduling) only
        steps that neither verify drafts (their count of new tokens is known only from
        the rejection sampler) nor are followed by proposals (the n-gram proposer reads
        every token); the others are waited for, as without async scheduling.
        """
        if self.ngram is None:
            return False  # a draft model's drafts stay on the device (sched_async_spec)
        scheduled = scheduler_output.scheduled
        return self.spec.speculates_at(len(scheduled)) or any(s.spec_token_ids for s in scheduled)

    def propose_drafts(self, runner_output: ModelRunnerOutput) -> None:
        """Drafts for the next step of every request about to decode: the n-gram
        proposer's, or those the draft model proposed in this step
        (``runner_output.draft_token_ids``).

        Such a request has all its tokens computed but the one it just gained (a request
        that wants logprobs too: a step returns a row for every token it keeps).
        """
        proposed = runner_output.draft_token_ids
        by_id = {} if proposed is None else dict(zip(runner_output.req_ids, proposed))
        drafts = {}
        for request in self.scheduler.running:
            if request.num_computed_tokens == request.num_tokens - 1:
                if self.ngram is not None:
                    drafts[request.request_id] = self.ngram.propose_one(request.all_token_ids)
                elif request.request_id in by_id:
                    drafts[request.request_id] = by_id[request.request_id]
        self.scheduler.update_draft_token_ids(drafts)


def _async_note(spec: SpeculativeConfig, async_scheduling: bool) -> str:
    """How speculation and async scheduling combine, for the start-up log line."""
    if spec.disable_by_batch_size is None:
        return f"async scheduling is {'on' if async_scheduling else 'off'}"
    note = f"steps of more than {spec.disable_by_batch_size} requests propose none"
    if spec.method == "ngram":
        return note + (", and only they run ahead" if async_scheduling else "")
    return note + f"; async scheduling is {'on' if async_scheduling else 'off'}"


def _fill_drafts_in_flight(in_flight: SchedulerOutput, runner_output: ModelRunnerOutput) -> None:
    """Write the drafts a step proposed into the step in flight that verifies them
    (upstream: ``Scheduler.update_draft_token_ids_in_output``).

    With async scheduling and a draft model, the step in flight was scheduled before
    these drafts reached the host: its requests carry ``DRAFT_PLACEHOLDER``s there (the
    runner took the values from the device). The scheduler needs the values when it
    applies that step's result (the accepted drafts become output tokens).
    """
    proposed = runner_output.draft_token_ids
    if proposed is None:
        return
    by_id = dict(zip(runner_output.req_ids, proposed))
    for s in in_flight.scheduled:
        drafts = by_id.get(s.request_id)
        if drafts is not None and s.spec_token_ids and s.spec_token_ids[0] == DRAFT_PLACEHOLDER:
            s.spec_token_ids = list(drafts[: len(s.spec_token_ids)])
