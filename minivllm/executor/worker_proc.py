"""The worker process's side of tensor parallelism: its loop, its reply thread, its watchdog.

Upstream counterpart: ``WorkerProc`` in ``vllm/v1/executor/multiproc_executor.py``
(``worker_main``, ``worker_busy_loop``, ``async_output_busy_loop``,
``monitor_death_pipe``). The engine's side is
``minivllm/executor/multiproc_executor.py``; the messages on the pipe are defined in
``minivllm/executor/worker_messages.py``: typed msgpack, never pickle.
"""

from __future__ import annotations

import os
import queue
import signal
import threading
import time
from multiprocessing.connection import Connection
from typing import Any

import msgspec

from minivllm.config import VllmConfig
from minivllm.executor.worker_messages import (
    Shutdown,
    WorkerError,
    WorkerMessageEncoder,
    WorkerReply,
    decode_call,
)
from minivllm.runner_outputs import AsyncModelRunnerOutput

_STOP = object()
"""Ends the reply thread (None cannot: it is what most calls return)."""


def worker_main(
    vllm_config: VllmConfig,
    rank: int,
    distributed_init_method: str,
    conn: Connection,
    inherited: list[Connection],
) -> None:
    """Entry point of a worker process: serve calls from the engine until told to stop.

    Calls run on this thread in the order they arrive; their answers go out from a
    second thread (``_send_replies``), in the same order. Each call's exception is sent
    back as a ``WorkerError`` and the loop goes on (the executor decides what a failure
    means). A message that does not decode as a known call is answered with an error
    too: every rank got the same bytes, so every rank refuses it and they stay in step.
    """
    # Ctrl-C reaches the whole foreground process group; only the engine handles it.
    signal.signal(signal.SIGINT, signal.SIG_IGN)
    for other in inherited:
        other.close()
    _watch_parent(os.getppid())
    from minivllm.worker.worker import Worker

    worker = Worker(vllm_config, rank, distributed_init_method)
    replies: queue.SimpleQueue = queue.SimpleQueue()
    sender = threading.Thread(
        target=_send_replies, args=(worker, conn, replies), name="reply-sender", daemon=True
    )
    sender.start()
    try:
        while True:
            try:
                data = conn.recv_bytes()
            except EOFError:
                return  # the engine closed its end: it is gone
            try:
                call = decode_call(data)
            except msgspec.MsgspecError as exc:
                replies.put(WorkerError.from_exception(exc))
                continue
            if isinstance(call, Shutdown):
                return
            try:
                replies.put(getattr(worker, call.method())(*call.arguments()))
            except Exception as exc:
                replies.put(_error(worker, exc))
    finally:
        replies.put(_STOP)
        sender.join(timeout=5.0)
        worker.shutdown()
        conn.close()


def _send_replies(worker: Any, conn: Connection, replies: queue.SimpleQueue) -> None:
    """The reply thread: send each answer, first waiting for a step's tokens.

    A step's answer is a handle to tokens the device is still computing; waiting for
    them here, not on the main thread, is what lets the main thread queue the next step
    meanwhile (vLLM: ``WorkerProc.async_output_busy_loop``). Only rank 0 sends a step's
    output: every rank samples the same tokens, and the others' pipes carry a few bytes.
    ``replies`` holds each call's return value or its ``WorkerError``.
    """
    encoder = WorkerMessageEncoder()
    device_set = False
    while (result := replies.get()) is not _STOP:
        if isinstance(result, AsyncModelRunnerOutput):
            if not device_set and worker.vllm_config.device.type == "cuda":
                # A new thread starts on GPU 0; without this its first CUDA call would
                # make a context there, in every rank's process.
                import torch

                torch.cuda.set_device(worker.vllm_config.device)
                device_set = True
            try:
                output = result.get_output()
                result = output if worker.rank == 0 else None
            except Exception as exc:
                result = _error(worker, exc)
        try:
            data = encoder.encode(_reply(worker.rank, result))
        except Exception as exc:  # a value msgpack cannot carry (a tensor, say)
            data = encoder.encode(_reply(worker.rank, WorkerError.from_exception(exc)))
        try:
            conn.send_bytes(data)
        except OSError:
            return  # the engine closed its end: nobody reads the answers any more


def _reply(rank: int, result: Any) -> WorkerReply:
    if isinstance(result, WorkerError):
        return WorkerReply(rank, error=result)
    return WorkerReply(rank, result)


def _error(worker: Any, exc: Exception) -> WorkerError:
    """``exc`` as data; fatal when this rank's GPU can run nothing any more, so the
    executor stops every worker at once."""
    return WorkerError.from_exception(exc, fatal=_device_is_broken(worker))


def _device_is_broken(worker: Any) -> bool:
    """True when this rank's CUDA context is unusable; checked only after an error. The
    in-process counterpart is ``UniProcExecutor.is_failed``."""
    from minivllm.utils.torch_utils import cuda_context_is_broken

    return cuda_context_is_broken(worker.vllm_config.device)


def _watch_parent(parent_pid: int) -> None:
    """Exit this process when the engine process dies, even mid-collective.

    The pipe's EOF only wakes a worker that is waiting on the pipe; one blocked in an
    all-reduce whose peer was killed would wait forever. A daemon thread polling the
    parent's pid catches both cases (vLLM's ``monitor_death_pipe`` plays this role).
    """

    def watch() -> None:
        while os.getppid() == parent_pid:
            time.sleep(0.5)
        os._exit(1)

    threading.Thread(target=watch, name="parent-watchdog", daemon=True).start()
