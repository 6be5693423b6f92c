"""What the engine core asks of a scheduler, and what each call promises.

Upstream counterpart: ``SchedulerInterface`` in ``vllm/v1/core/sched/interface.py``.

Upstream keeps the contract apart from ``Scheduler`` so that another scheduler can be
plugged in (``SchedulerConfig.scheduler_cls``). minivllm has one scheduler, and keeps the
contract apart for the reader: every call ``EngineCore`` makes of its scheduler is here,
with what each one guarantees, on one page (``tests/core/test_sched_interface.py`` runs
the engine through a scheduler that exposes nothing else); ``scheduler.py`` says how
``Scheduler`` keeps them.

A step, as the engine core drives it:

1. ``add_request`` and ``finish_requests`` (aborts) arrive between steps, at any time;
2. ``schedule`` builds the step's batch;
3. the model runs it; before its tokens are applied the core asks ``keeps_token`` of
   each request that sampled, then hands the tokens to ``update_from_output`` (or, when
   running the step raised, its requests to ``fail_step``);
4. with speculative decoding, ``update_draft_token_ids`` gives running requests their
   drafts for the next ``schedule``;
5. ``make_stats`` and ``has_unfinished_requests`` say where things stand.

With async scheduling, step 2 of step ``N + 1`` comes before step 3 of step ``N``: every
call must hold with one step in flight.
"""

from __future__ import annotations

from abc import ABC, abstractmethod
from collections.abc import Iterable, Mapping, Sequence

from minivllm.core.sched_output import SchedulerOutput, SchedulerStats
from minivllm.request import Request, RequestStatus


class SchedulerInterface(ABC):
    """The scheduler as the engine core sees it.

    Attributes:
        requests: Every unfinished request by id (the engine core reads it, e.g. for a
            prefill chunk's prompt logprobs).
        running: Admitted requests in admission order (the drafter proposes for them).
    """

    requests: dict[str, Request]
    running: list[Request]

    @abstractmethod
    def add_request(self, request: Request) -> None:
        """Validate a new request and queue it behind the others.

        Raises:
            ValueError: The id is already in use; the prompt leaves no room for one
                generated token within ``max_model_len``; or the request, even alone,
                could not finish in the KV pool. Nothing is kept.
        """

    @abstractmethod
    def schedule(self) -> SchedulerOutput:
        """Build the next step: how many tokens of which requests the model runs, with
        their KV blocks allocated. Requests' ``num_computed_tokens`` already count the
        step when it returns (the output keeps the values from before it)."""

    @abstractmethod
    def update_from_output(
        self,
        scheduler_output: SchedulerOutput,
        sampled_token_ids: Mapping[str, int] | Sequence[int],
        errors: Mapping[str, str] | None = None,
        num_accepted_tokens: Sequence[int] | None = None,
    ) -> list[Request]:
        """Append a step's sampled tokens, apply the stop rules and free finished requests.

        Args:
            scheduler_output: The output of the step that just ran.
            sampled_token_ids: One token per request that was due to sample: a mapping
                request id -> token, or a list aligned with
                ``scheduler_output.sampling_requests()``. Partial prefills get nothing.
            errors: Request id -> why the runner could not sample for it (its logits
                were not finite). Such a request gets no token: it finishes with
                ``FINISHED_ERROR`` and the message as its ``stop_reason``.
            num_accepted_tokens: With speculative decoding, how many of each request's
                drafts the rejection sampler accepted (aligned like a list of
                ``sampled_token_ids``); the request gains those drafts, then its sampled
                token. Required when a request was scheduled with drafts.

        Returns:
            The requests that finished in this step (errors included), in batch order.

        Raises:
            ValueError: The tokens do not match the requests that were due to sample
                (checked before anything is changed).
        """

    @abstractmethod
    def update_draft_token_ids(self, draft_token_ids: Mapping[str, Sequence[int]]) -> None:
        """Give running requests their drafts for the next step; drafts of requests that
        are no longer running are dropped."""

    def keeps_token(self, request: Request) -> bool:
        """Whether a token the model sampled for ``request`` will be appended to it.

        Not when the request finished while the step ran (aborted, or, with async
        scheduling, stopped in the step before): that token is past its end. The rule
        needs only ``requests``, so every scheduler shares it: the request must be
        unfinished and still the one registered under its id (ids may be reused).
        """
        return not request.is_finished() and self.requests.get(request.request_id) is request

    @abstractmethod
    def finish_requests(
        self, request_ids: str | Iterable[str], status: RequestStatus
    ) -> list[Request]:
        """Finish requests from outside (e.g. aborts), wherever they are queued, and free
        their blocks. Unknown or already-finished ids are ignored.

        Returns:
            The requests finished here.

        Raises:
            ValueError: ``status`` is not a finished status.
        """

    @abstractmethod
    def fail_step(
        self, scheduler_output: SchedulerOutput, message: str, resend_finished: bool
    ) -> list[Request]:
        """Finish with ``FINISHED_ERROR`` every request a failed step scheduled.

        Running the step raised, so none of its results can be trusted: each request
        it scheduled (if still unfinished and still the same object: ids may be reused)
        gets ``message`` as its ``stop_reason`` and loses its blocks; other requests run
        on. The runner and the TP workers' mirrors drop the failed requests' state when
        the next step names them in ``finished_req_ids``, as for any finished request.
        ``resend_finished``: the runner may not have read this step's
        ``finished_req_ids``; name them again next step (dropping state is idempotent).

        Returns:
            The requests failed here, in batch order.
        """

    @abstractmethod
    def get_num_unfinished_requests(self) -> int:
        """Number of requests waiting or running."""

    def has_unfinished_requests(self) -> bool:
        """True while any request is waiting or running."""
        return self.get_num_unfinished_requests() > 0

    @abstractmethod
    def make_stats(self) -> SchedulerStats:
        """A snapshot of queue lengths, KV usage and counters for logs and summaries."""
