"""What crosses the pipes between the engine and its tensor-parallel workers, and how.

Upstream counterparts: the ``(method, args, kwargs)`` calls of
``MultiprocExecutor.collective_rpc`` and the ``(ResponseStatus, output)`` answers of
``WorkerProc.worker_busy_loop`` in ``vllm/v1/executor/multiproc_executor.py`` (upstream
pickles both onto its shared-memory ``MessageQueue``), encoded the way
``vllm/v1/serial_utils.py`` (``MsgpackEncoder``, ``MsgpackDecoder``) encodes the engine
core's messages.

The engine calls a fixed set of ``Worker`` methods, so each is a typed message: one
``msgspec.Struct`` per method (a ``WorkerCall``, tagged with the method's name, its
fields the method's arguments). Each answer is a ``WorkerReply`` of the type that
method returns (``WORKER_CALLS[name].returns``), or of an error. Both directions are
msgpack, and every decoder is built for one type: an unknown method, a missing or extra
argument, or a field of the wrong type is a ``msgspec.ValidationError``. Nothing is
pickled, so no message can name code for the receiver to run.

Per step, every rank receives an ``ExecuteModel`` holding the step's ``StepMessage``
(the diff of the scheduler's output: new requests with their sampling parameters, per
scheduled request its new tokens, block ids and drafts). Rank 0 answers with the
step's ``ModelRunnerOutput`` (plain lists of token ids and logprob rows: no tensors
cross), the other ranks with an empty acknowledgement. ``KVCacheSpec``'s
``torch.dtype`` is the one field that is not plain data: it crosses as its name
(``"bfloat16"``) and comes back only as a dtype torch knows by that name.

An exception raised on a worker crosses as a ``WorkerError``: its type's name, its
message, the worker's traceback and whether the rank's GPU is broken. The class itself
does not cross (rebuilding an arbitrary class is what pickle would do); the executor
raises ``RuntimeError("rank R: Type: message")`` with the remote traceback below it.
"""

from __future__ import annotations

import traceback
from typing import Any, ClassVar, Generic, TypeVar, Union

import msgspec
import torch

from minivllm.core.step_message import StepMessage
from minivllm.runner_outputs import ModelRunnerOutput
from minivllm.worker.kv_cache import KVCacheSpec

T = TypeVar("T")


class WorkerCall(
    msgspec.Struct, tag_field="method", array_like=True, frozen=True, forbid_unknown_fields=True
):
    """A call of one ``Worker`` method: the tag is its name, the fields its arguments.

    On the wire ``[name, arg, ...]``. ``returns`` is the type its answer decodes as.
    """

    returns: ClassVar[Any] = None

    @classmethod
    def method(cls) -> str:
        """The ``Worker`` method this message calls."""
        return cls.__struct_config__.tag

    def arguments(self) -> tuple:
        """The method's positional arguments."""
        return msgspec.structs.astuple(self)


class InitDevice(WorkerCall, tag="init_device"):
    """``Worker.init_device``: pick the device, join the process group."""


class LoadModel(WorkerCall, tag="load_model"):
    """``Worker.load_model``: build the model runner with this rank's shards."""


class GetKVSpec(WorkerCall, tag="get_kv_spec"):
    """``Worker.get_kv_spec``: this rank's KV cache geometry."""

    returns: ClassVar[Any] = KVCacheSpec


class DetermineNumBlocks(WorkerCall, tag="determine_num_blocks"):
    """``Worker.determine_num_blocks``: how many KV blocks fit on this rank."""

    returns: ClassVar[Any] = int


class InitializeKVCache(WorkerCall, tag="initialize_kv_cache"):
    """``Worker.initialize_kv_cache``: allocate the agreed number of blocks."""

    num_blocks: int


class ExecuteModel(WorkerCall, tag="execute_model"):
    """``Worker.execute_model``: one step (rank 0 answers its output, the others None)."""

    msg: StepMessage
    returns: ClassVar[Any] = ModelRunnerOutput


class Profile(WorkerCall, tag="profile"):
    """``Worker.profile``: start or stop this rank's torch profiler; on stop, the path of
    the trace it wrote."""

    is_start: bool
    trace_dir: str
    returns: ClassVar[Any] = str


class Shutdown(WorkerCall, tag="shutdown"):
    """Ends the worker's loop (it leaves the process group and exits); never answered."""


WORKER_CALLS: dict[str, type[WorkerCall]] = {
    cls.method(): cls
    for cls in (
        InitDevice,
        LoadModel,
        GetKVSpec,
        DetermineNumBlocks,
        InitializeKVCache,
        ExecuteModel,
        Profile,
    )
}
"""The methods ``collective_rpc`` may call on the workers, by name (``Shutdown`` is the
executor's own)."""


class WorkerError(msgspec.Struct, array_like=True, frozen=True, forbid_unknown_fields=True):
    """An exception raised on a worker, as data.

    Attributes:
        type_name: The exception's class name (``ValueError``).
        message: ``str(exception)``.
        traceback: The worker's formatted traceback.
        fatal: The rank's GPU context is broken: no later call can succeed there.
    """

    type_name: str
    message: str
    traceback: str
    fatal: bool = False

    @classmethod
    def from_exception(cls, exc: BaseException, fatal: bool = False) -> WorkerError:
        """Describe ``exc`` (with its traceback)."""
        tb = "".join(traceback.format_exception(type(exc), exc, exc.__traceback__))
        return cls(type(exc).__name__, str(exc), tb, fatal)

    @property
    def summary(self) -> str:
        """``Type: message``, saying so when the rank cannot run anything any more."""
        summary = f"{self.type_name}: {self.message}"
        if self.fatal:
            summary += "; the GPU's context is broken, so this rank cannot run anything any more"
        return summary


class WorkerReply(
    msgspec.Struct, Generic[T], array_like=True, frozen=True, forbid_unknown_fields=True
):
    """One rank's answer to one call: the method's return value, or its error.

    Attributes:
        rank: Who answers (checked against the pipe it came from).
        value: What the method returned (None for an acknowledgement).
        error: Set when the call raised; ``value`` is then None.
    """

    rank: int
    value: T | None = None
    error: WorkerError | None = None


def _enc_hook(obj: Any) -> Any:
    if isinstance(obj, torch.dtype):
        return str(obj).removeprefix("torch.")
    # A tensor or array that reached a reply would otherwise need pickle: refuse it.
    raise TypeError(f"a {type(obj).__name__} cannot cross a worker pipe")


def _dec_hook(type_: type, obj: Any) -> Any:
    if type_ is torch.dtype:
        dtype = getattr(torch, obj, None) if isinstance(obj, str) else None
        if not isinstance(dtype, torch.dtype):
            raise ValueError(f"{obj!r} is not a torch dtype")
        return dtype
    raise NotImplementedError(f"no decoding for {type_!r}")


class WorkerMessageEncoder:
    """Encodes calls (engine side) and replies (worker side); one per thread that sends."""

    def __init__(self) -> None:
        self._encoder = msgspec.msgpack.Encoder(enc_hook=_enc_hook)

    def encode(self, message: WorkerCall | WorkerReply) -> bytes:
        """A call or a reply to bytes."""
        return self._encoder.encode(message)


# One decoder for every call: msgspec picks the struct by its tag, the method's name.
_call_decoder = msgspec.msgpack.Decoder(
    Union[(*WORKER_CALLS.values(), Shutdown)],
    dec_hook=_dec_hook,
)
_reply_decoders = {
    name: msgspec.msgpack.Decoder(WorkerReply[cls.returns], dec_hook=_dec_hook)
    for name, cls in WORKER_CALLS.items()
}


def decode_call(data: bytes | memoryview) -> WorkerCall:
    """Worker side: bytes from the engine to the call they encode.

    Raises:
        msgspec.ValidationError: Not a known call with arguments of the right types.
        msgspec.DecodeError: Not msgpack at all.
    """
    return _call_decoder.decode(data)


def decode_reply(rank: int, method: str, data: bytes | memoryview) -> WorkerReply:
    """Engine side: bytes from rank ``rank`` to its reply to a call of ``method``.

    Raises:
        RuntimeError: The reply does not decode as ``method``'s, or names another rank:
            the two sides disagree on the protocol, so nothing the workers say can be
            trusted (the executor stops them).
    """
    try:
        reply = _reply_decoders[method].decode(data)
    except msgspec.MsgspecError as exc:
        raise RuntimeError(f"rank {rank}: malformed reply to {method}: {exc}") from None
    if reply.rank != rank:
        raise RuntimeError(f"rank {rank}: its reply to {method} names rank {reply.rank}")
    return reply


def make_call(method: str, args: tuple = (), kwargs: dict[str, Any] | None = None) -> WorkerCall:
    """``collective_rpc``'s arguments as a checked call, refused before anything is sent.

    Raises:
        ValueError: ``method`` is not one of ``WORKER_CALLS``.
        TypeError: Arguments missing, extra, or of the wrong types for ``method``.
    """
    cls = WORKER_CALLS.get(method)
    if cls is None:
        raise ValueError(
            f"{method!r} is not a Worker method the executor can call over the workers' "
            f"pipes; it can call {sorted(WORKER_CALLS)}"
        )
    try:
        call = cls(*args, **(kwargs or {}))
    except TypeError as exc:
        raise TypeError(f"Worker.{method}: {exc}") from None
    # The constructor checks names, not types: a round trip checks every field the way
    # the workers will, so a mistyped argument fails here and not on every rank.
    try:
        return decode_call(msgspec.msgpack.encode(call, enc_hook=_enc_hook))
    except (msgspec.ValidationError, TypeError) as exc:
        raise TypeError(f"Worker.{method}: {exc}") from None
