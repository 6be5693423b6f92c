"""The messages between the front end and the engine core.

Upstream counterpart: ``vllm/v1/engine/__init__.py`` (``EngineCoreRequest``,
``EngineCoreOutput``, ``EngineCoreOutputs``, ``EngineCoreEvent``, ``FinishReason``,
``EngineCoreRequestType``).

The engine core (scheduler + executor) may run in another process, so everything that
crosses the boundary is a ``msgspec.Struct`` (or a dataclass of plain fields) that
``msgspec.msgpack`` encodes without pickle. In the front end's direction go whole
requests and aborts; back come, once per step, only what changed: each request's new
token ids, its new logprob rows, and a finish reason when it ended. Text never crosses:
detokenization and stop strings live in the front end, next to the tokenizer.
"""

from __future__ import annotations

import enum
import time

import msgspec

from minivllm.core.sched_output import SchedulerStats
from minivllm.core.step_record import StepRecord
from minivllm.runner_outputs import LogprobsLists, PromptLogprobsChunk
from minivllm.sampling_params import SamplingParams


class FinishReason(enum.IntEnum):
    """Why a request ended; an int on the wire, the OpenAI string in outputs.

    ``ERROR`` is minivllm's: the core refused a request it was sent (upstream uses it for
    request-level internal errors, always turned into an HTTP 500).
    """

    STOP = 0
    LENGTH = 1
    ABORT = 2
    ERROR = 3

    def __str__(self) -> str:
        return self.name.lower()


class EngineCoreRequestType(bytes, enum.Enum):
    """The first frame of every message to the core: what the second frame holds."""

    ADD = b"\x00"
    ABORT = b"\x01"
    SHUTDOWN = b"\x04"
    # minivllm's: turn per-step records on (payload: the sampling interval in seconds)
    # or off (payload: None). Upstream would send a generic UTILITY call instead.
    STEP_RECORDS = b"\x05"


class EngineCoreRequest(msgspec.Struct, array_like=True, omit_defaults=True, gc=False):
    """One request as the core receives it: token ids and validated parameters.

    ``sampling_params.max_tokens`` is resolved (never None) and ``n`` is 1: the front end
    fans ``n > 1`` out into child requests before they reach the core.
    """

    request_id: str
    prompt_token_ids: list[int]
    sampling_params: SamplingParams
    eos_token_id: int | None
    arrival_time: float


class EngineCoreEventType(enum.IntEnum):
    """Scheduling events the front end turns into queue and prefill times."""

    QUEUED = 1
    SCHEDULED = 2
    PREEMPTED = 3


class EngineCoreEvent(msgspec.Struct, array_like=True, gc=False):
    """A timestamped event of one request (``time.monotonic()`` of the core's host)."""

    type: EngineCoreEventType
    timestamp: float

    @classmethod
    def new_event(cls, event_type: EngineCoreEventType) -> EngineCoreEvent:
        """An event stamped now."""
        return cls(event_type, time.monotonic())


class EngineCoreOutput(msgspec.Struct, array_like=True, omit_defaults=True, gc=False):
    """What one request gained in one step.

    Attributes:
        request_id: The (child) request.
        new_token_ids: Tokens appended this step (empty for a partial prefill).
        new_logprobs: One row per new token when logprobs were asked for.
        new_prompt_logprobs: Prompt logprobs computed this step (a prefill chunk).
        finish_reason: Set when the request ended in the core (EOS, stop token, length).
        stop_reason: The stop token id that ended it, or the error message for ``ERROR``.
        num_cached_tokens: Prompt tokens served from the prefix cache (on the first
            output of a request, and again after a preemption).
        events: Scheduling events since the request's previous output.
        num_draft_tokens: Draft tokens verified for it this step (speculative decoding).
        num_accepted_tokens: Of those, accepted (they lead ``new_token_ids``).
    """

    request_id: str
    new_token_ids: list[int]
    new_logprobs: LogprobsLists | None = None
    new_prompt_logprobs: PromptLogprobsChunk | None = None
    finish_reason: FinishReason | None = None
    stop_reason: int | str | None = None
    num_cached_tokens: int = 0
    events: list[EngineCoreEvent] | None = None
    num_draft_tokens: int = 0
    num_accepted_tokens: int = 0

    @property
    def finished(self) -> bool:
        """True when the core ended the request."""
        return self.finish_reason is not None


class EngineCoreOutputs(
    msgspec.Struct, array_like=True, omit_defaults=True, gc=False, tag=True
):
    """Everything one engine step produced, sent as one message.

    Attributes:
        outputs: One entry per request that gained tokens, prompt logprobs or a finish.
        scheduler_stats: The scheduler's counters after the step.
        timestamp: ``time.monotonic()`` when the step's results were processed.
        engine_error: Set (with nothing else) when the core failed and is going down.
        step_records: Pictures of steps as scheduled (``minivllm.core.step_record``),
            only while a viewer asked for them: at most one per sampling interval, plus
            one of the freed pool when the engine runs out of work.
    """

    outputs: list[EngineCoreOutput] = []
    scheduler_stats: SchedulerStats | None = None
    timestamp: float = 0.0
    engine_error: str | None = None
    step_records: list[StepRecord] = []

    def __post_init__(self) -> None:
        if self.timestamp == 0.0:
            self.timestamp = time.monotonic()


class EngineCoreReadyResponse(msgspec.Struct, array_like=True, gc=False, tag=True):
    """The core's first message: it is up, and what it sized at start."""

    num_kv_blocks: int
    max_model_len: int
