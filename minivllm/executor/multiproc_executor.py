"""Tensor parallelism over N worker processes, driven from the engine's process.

Upstream counterpart: ``vllm/v1/executor/multiproc_executor.py`` (``MultiprocExecutor``,
``FutureWrapper``); the worker process's side (``WorkerProc``) is
``minivllm/executor/worker_proc.py``.

Process layout: the engine process (scheduler, tokenizer, detokenizer) is *not* a rank.
It starts one worker process per rank, and every call is a collective RPC: the same
encoded call is written to every worker's pipe, every worker runs it, and every worker
answers (rank 0 with the result, the others with an acknowledgement).

What crosses the pipes (``minivllm/executor/worker_messages.py``): one typed msgpack
message per call, one of a fixed set of ``Worker`` methods (start-up: ``init_device``,
``load_model``, ``get_kv_spec``, ``determine_num_blocks``, ``initialize_kv_cache``; then
per step an ``execute_model`` holding the step's ``StepMessage`` diff; last a
``shutdown``), and per rank a typed reply: rank 0's ``ModelRunnerOutput`` of a step as
plain lists, or a ``WorkerError`` (type name, message, traceback, fatal flag). Nothing
on the pipes is pickled. Only the start of a worker hands it the configuration the
ordinary ``multiprocessing`` way (inherited by a forked child; pickled once by
``spawn`` into the interpreter the engine itself starts, as any spawned process's
arguments are).

Keeping the engine out of the collectives is what makes failures reportable: a rank that
raises may leave the others blocked inside an all-reduce, and only a process that is not
itself blocked there can notice, name the rank, and decide. It waits a little for the
other ranks' answers: if every rank answers, the ranks are still in step (they all
raised the same error, or the failure came after the step's last collective), so only
that call failed and the workers serve on. If a rank stays silent, it is stuck in a
collective its failed peer never joined; a rank whose process died is gone. Then the
only safe state is no workers: all are stopped, and the executor ``is_failed``.

Async scheduling: a call is *sent* and *answered* separately. ``execute_model_async``
writes the step to every pipe and returns a handle at once (vLLM's ``non_block=True``
and ``FutureWrapper``); the answers are read when the engine asks the handle, after it
has scheduled and sent the next step. Each worker runs calls on its main thread and
answers from a second thread, which waits for the step's tokens to reach the host, so
the main thread takes the next step's message while the device still runs this one.
Answers arrive in the order calls were sent, so reading the oldest pending call first
keeps every call paired with its answers.

vLLM does the same with a shared-memory ring buffer (``MessageQueue``) for the
broadcast and a response queue per worker; minivllm uses one ``multiprocessing`` pipe
per worker, which costs a few tens of microseconds more per step and needs no code.
"""

from __future__ import annotations

import contextlib
import logging
import multiprocessing as mp
import os
import time
import weakref
from collections import deque
from collections.abc import Callable
from multiprocessing.connection import Connection, wait
from multiprocessing.process import BaseProcess
from typing import Any

from minivllm.config import VllmConfig
from minivllm.core.sched_output import SchedulerOutput
from minivllm.core.step_message import StepMessageEncoder
from minivllm.distributed.utils import get_distributed_init_method, get_open_port
from minivllm.executor.abstract import Executor
from minivllm.executor.worker_messages import (
    ExecuteModel,
    Shutdown,
    WorkerCall,
    WorkerError,
    WorkerMessageEncoder,
    decode_reply,
    make_call,
)
from minivllm.executor.worker_proc import worker_main
from minivllm.runner_outputs import AsyncModelRunnerOutput, ModelRunnerOutput

logger = logging.getLogger(__name__)

START_METHOD_ENV = "MINIVLLM_WORKER_MULTIPROC_METHOD"
"""Environment variable that forces ``fork`` or ``spawn`` (vLLM:
``VLLM_WORKER_MULTIPROC_METHOD``)."""

STRAGGLER_TIMEOUT_S = 5.0
"""Once one rank's call failed, how long the other ranks get to answer before they count
as stuck in a collective (the ranks out of step: the workers are stopped)."""


def get_mp_context(vllm_config: VllmConfig) -> mp.context.BaseContext:
    """``spawn`` on CUDA, ``fork`` on the CPU (unless ``START_METHOD_ENV`` says otherwise).

    A forked child inherits its parent's CUDA state, which CUDA does not support, so
    GPU workers are spawned: a fresh interpreter that imports torch again (seconds).
    On the CPU there is no such state, and fork starts a worker in milliseconds.
    """
    method = os.environ.get(START_METHOD_ENV)
    if method is None:
        cpu = vllm_config.device.type == "cpu"
        method = "fork" if cpu and "fork" in mp.get_all_start_methods() else "spawn"
    return mp.get_context(method)


class MultiprocExecutor(Executor):
    """Starts ``tensor_parallel_size`` worker processes and runs every call on all of them.

    An exception in a rank raises ``RuntimeError("rank R: <error>")`` with the remote
    traceback. When every rank still answered, that is all: the workers serve the next
    call. When a rank does not answer within ``STRAGGLER_TIMEOUT_S`` of the failure, or
    a worker process died, or Ctrl-C interrupts a call, every worker is shut down and
    ``is_failed`` turns True. Workers are daemons, ignore SIGINT (the engine decides),
    and exit by themselves when the engine process disappears.
    """

    def __init__(self, vllm_config: VllmConfig) -> None:
        super().__init__(vllm_config)
        self.world_size = vllm_config.parallel_config.tensor_parallel_size
        self.workers: list[BaseProcess] = []
        self.conns: list[Connection] = []
        self._encoder = StepMessageEncoder()
        self._message_encoder = WorkerMessageEncoder()
        self._dead_reason: str | None = None
        # Calls sent whose answers are not read yet, oldest first.
        self._pending: deque[PendingCall] = deque()
        # Runs shutdown when the executor is garbage collected or the interpreter exits,
        # so a forgotten LLM never leaves processes behind.
        self._finalizer = weakref.finalize(self, _terminate_workers, self.workers, self.conns)
        try:
            self._start_workers()
            self.collective_rpc("init_device")
            self.collective_rpc("load_model")
            self.kv_spec = self.collective_rpc("get_kv_spec")[0]
        except BaseException:
            self.shutdown(graceful=False)
            raise

    def _start_workers(self) -> None:
        ctx = get_mp_context(self.vllm_config)
        init_method = get_distributed_init_method("127.0.0.1", get_open_port())
        for rank in range(self.world_size):
            parent_end, child_end = ctx.Pipe()
            proc = ctx.Process(
                target=worker_main,
                # A forked child inherits the engine's ends of the earlier workers'
                # pipes; it closes them, or they would outlive the engine.
                args=(self.vllm_config, rank, init_method, child_end, list(self.conns)),
                name=f"minivllm-tp-rank{rank}",
                daemon=True,
            )
            proc.start()
            child_end.close()
            self.workers.append(proc)
            self.conns.append(parent_end)

    # ---- calls -----------------------------------------------------------------------

    def collective_rpc(
        self,
        method: str | Callable[..., Any],
        args: tuple = (),
        kwargs: dict[str, Any] | None = None,
    ) -> list[Any]:
        """Run ``Worker.<method>(*args, **kwargs)`` on every rank; return the answers in
        rank order.

        The call is encoded once (``worker_messages.make_call``) and the same bytes go
        to every pipe. Answers are awaited from all ranks at once, so whichever rank
        fails first is reported. Only the methods of ``WORKER_CALLS`` cross the pipe,
        with arguments of their declared types: upstream also ships callables (with
        cloudpickle), which would let any code through the workers' pipes.

        Raises:
            TypeError: ``method`` is a callable, or its arguments do not fit it (nothing
                was sent).
            ValueError: ``method`` is not one of ``WORKER_CALLS`` (nothing was sent).
            RuntimeError: A rank raised (``is_failed`` says whether the workers were
                stopped as well), a worker died, or the workers are already stopped.
        """
        if not isinstance(method, str):
            raise TypeError(
                "MultiprocExecutor.collective_rpc takes the name of a Worker method; a "
                f"callable ({method!r}) would have to be pickled to reach the worker "
                "processes. Call a Worker method by name instead."
            )
        return self._send(make_call(method, args, kwargs)).get_output()

    def _send(self, call: WorkerCall, reply_rank: int | None = None) -> PendingCall:
        """Write one call to every worker's pipe; return the handle to its answers."""
        method = call.method()
        if self._dead_reason is not None:
            raise RuntimeError(f"the tensor-parallel workers are shut down: {self._dead_reason}")
        data = self._message_encoder.encode(call)
        try:
            for rank, conn in enumerate(self.conns):
                try:
                    conn.send_bytes(data)
                except OSError:  # the worker's end is closed: its process is gone
                    raise self._died(rank, method) from None
        except BaseException as exc:
            self._stop_after(method, exc)
            raise
        call = PendingCall(self, method, reply_rank)
        self._pending.append(call)
        return call

    def _wait_for(self, call: PendingCall) -> None:
        """Read answers, oldest call first, until ``call`` has its own."""
        while not call.done:
            oldest = self._pending.popleft()
            try:
                oldest.set_result(self._receive(oldest.method))
            except Exception as exc:  # that call's own error, raised by its handle
                oldest.set_error(exc)
            except BaseException as exc:  # Ctrl-C: the workers are already stopped
                oldest.set_error(exc)
                raise

    def _receive(self, method: str) -> list[Any]:
        """Every rank's answer to the oldest pending call (see ``collective_rpc``)."""
        try:
            results, error = self._gather(method)
        except BaseException as exc:
            self._stop_after(method, exc)
            raise
        if error is not None:
            raise error  # every rank answered: the workers are in step and serve on
        return results

    def _stop_after(self, method: str, exc: BaseException) -> None:
        """A dead worker, a silent rank or Ctrl-C mid-call leaves the ranks out of step
        (some may be blocked in a collective forever): the only safe state is no workers."""
        first_line = str(exc).partition("\n")[0]
        self._dead_reason = f"{method} failed: {type(exc).__name__}: {first_line}"
        if not isinstance(exc, Exception):
            # Ctrl-C interrupted the calls in flight too: whoever waits on them (the
            # engine dropping a step while it aborts) sees the interrupt, not an error.
            while self._pending:
                self._pending.popleft().set_error(exc)
        self.shutdown(graceful=False)

    def _gather(self, method: str) -> tuple[list[Any], RuntimeError | None]:
        """Every rank's answer, and the first rank's error if one failed.

        Raises ``RuntimeError`` itself when a worker died, when a rank's GPU context is
        broken, when a reply does not decode as the call's, or when a rank is still
        silent ``STRAGGLER_TIMEOUT_S`` after another one failed.
        """
        results: list[Any] = [None] * self.world_size
        pending = dict(zip(self.conns, range(self.world_size)))
        failed: tuple[int, WorkerError] | None = None
        deadline = float("inf")
        while pending:
            if failed is not None and time.monotonic() > deadline:
                rank, error = failed
                raise _rank_error(
                    rank,
                    f"{error.summary}; rank(s) {sorted(pending.values())} did not answer "
                    f"within {STRAGGLER_TIMEOUT_S} s after that (stuck in a collective): the "
                    f"ranks are out of step",
                    error.traceback,
                )
            # A timeout, so an interrupt delivered to another thread is seen within 1 s.
            for conn in wait(list(pending), timeout=min(1.0, STRAGGLER_TIMEOUT_S)):
                rank = pending.pop(conn)
                try:
                    data = conn.recv_bytes()
                except (EOFError, OSError):
                    raise self._died(rank, method) from None
                reply = decode_reply(rank, method, data)  # raises: stop the workers
                if reply.error is None:
                    results[rank] = reply.value
                elif reply.error.fatal:  # that rank's GPU is unusable: no call can succeed
                    raise _rank_error(rank, reply.error.summary, reply.error.traceback)
                elif failed is None:
                    failed = (rank, reply.error)
                    deadline = time.monotonic() + STRAGGLER_TIMEOUT_S
        if failed is None:
            return results, None
        rank, error = failed
        return results, _rank_error(rank, error.summary, error.traceback)

    def _died(self, rank: int, method: str) -> RuntimeError:
        proc = self.workers[rank]
        proc.join(timeout=1.0)
        return RuntimeError(
            f"rank {rank}: the worker process died during {method} (exit code {proc.exitcode})"
        )

    @property
    def is_failed(self) -> bool:
        """True once the workers are stopped (see ``Executor.is_failed``)."""
        return self._dead_reason is not None

    def determine_num_blocks(self) -> int:
        """Each rank sizes its pool; all use the smallest so every block id is valid
        everywhere (vLLM: ``get_kv_cache_configs`` takes the same minimum)."""
        per_rank = self.collective_rpc("determine_num_blocks")
        if len(set(per_rank)) > 1:
            logger.info("KV blocks per rank %s: using the minimum", per_rank)
        return min(per_rank)

    def initialize_kv_cache(self, num_blocks: int) -> None:
        """Allocate ``num_blocks`` on every rank."""
        self.collective_rpc("initialize_kv_cache", (num_blocks,))

    def execute_model(self, scheduler_output: SchedulerOutput) -> ModelRunnerOutput:
        """Send the step's diff to every rank; return rank 0's sampled tokens."""
        return self.execute_model_async(scheduler_output).get_output()

    def execute_model_async(self, scheduler_output: SchedulerOutput) -> AsyncModelRunnerOutput:
        """Send the step's diff to every rank and return without waiting for an answer;
        the handle's ``get_output`` reads them (rank 0's is the step's output)."""
        msg = self._encoder.encode(scheduler_output)
        return self._send(ExecuteModel(msg), reply_rank=0)

    def shutdown(self, graceful: bool = True) -> None:
        """Stop every worker; idempotent.

        Graceful: ask each worker to leave the process group and exit, then wait.
        Otherwise (after an error, when ranks may be stuck in a collective): SIGTERM,
        then SIGKILL for any that survive.
        """
        if self._dead_reason is None:
            self._dead_reason = "shutdown() was called"
        while self._pending:  # their answers will never come
            self._pending.popleft().set_error(
                RuntimeError(f"the tensor-parallel workers are shut down: {self._dead_reason}")
            )
        if self._finalizer.detach() is not None:
            _terminate_workers(self.workers, self.conns, graceful)


class PendingCall(AsyncModelRunnerOutput):
    """A call sent to every rank whose answers may not have been read yet.

    Upstream counterpart: ``FutureWrapper`` in ``vllm/v1/executor/multiproc_executor.py``
    (it too drains the calls queued ahead of it before reading its own answers).

    Args:
        executor: The executor that reads the answers.
        method: The ``Worker`` method called (for error messages).
        reply_rank: Whose answer ``get_output`` returns; None: every rank's, as a list.
    """

    def __init__(self, executor: MultiprocExecutor, method: str, reply_rank: int | None) -> None:
        self._executor = executor
        self.method = method
        self._reply_rank = reply_rank
        self.done = False
        self._result: Any = None
        self._error: BaseException | None = None

    def set_result(self, results: list[Any]) -> None:
        """Record every rank's answer."""
        self._result = results if self._reply_rank is None else results[self._reply_rank]
        self.done = True

    def set_error(self, exc: BaseException) -> None:
        """Record the error ``get_output`` raises."""
        self._error, self.done = exc, True

    def get_output(self) -> Any:
        """Wait for the answers (reading those of earlier calls first) and return them;
        raise the call's error instead if it failed."""
        if not self.done:
            self._executor._wait_for(self)
        if self._error is not None:
            raise self._error
        return self._result


def _rank_error(rank: int, summary: str, remote_tb: str) -> RuntimeError:
    """``rank R: <summary>`` on the first line, the remote traceback below it."""
    return RuntimeError(f"rank {rank}: {summary}\n\nTraceback of rank {rank}:\n{remote_tb}")


def _terminate_workers(
    workers: list[BaseProcess], conns: list[Connection], graceful: bool = True
) -> None:
    """Make sure no worker process is left, gracefully if possible."""
    if graceful:
        for conn in conns:
            with contextlib.suppress(OSError):  # that worker is already gone
                conn.send_bytes(WorkerMessageEncoder().encode(Shutdown()))
        _join_all(workers, timeout=5.0)
    for proc in workers:
        if proc.is_alive():
            proc.terminate()
    _join_all(workers, timeout=5.0)
    for proc in workers:
        if proc.is_alive():
            proc.kill()
            proc.join()
    for conn in conns:
        conn.close()


def _join_all(workers: list[BaseProcess], timeout: float) -> None:
    deadline = time.monotonic() + timeout
    for proc in workers:
        proc.join(timeout=max(0.0, deadline - time.monotonic()))
