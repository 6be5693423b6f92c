"""The engine core's own process: its busy loop and the two socket threads.

Upstream counterpart: ``EngineCoreProc`` in ``vllm/v1/engine/core.py``
(``run_engine_core``, ``run_busy_loop``, ``process_input_sockets``,
``process_output_sockets``).

``EngineCoreProc`` runs ``EngineCore``'s loop in a process of its own (or, for
notebooks and tests, a thread), fed by ZeroMQ sockets. Why a separate process: the
front end's Python work (HTTP parsing, tokenizing, detokenizing, streaming to many
clients) then runs in parallel with the scheduler and the GPU instead of taking turns
with them under one GIL. Two helper threads move bytes between the sockets and two
queues, so socket I/O and msgspec decoding also stay off the busy loop::

    front end --PUSH--> [input thread]  -> input_queue  -> busy loop: add/abort, step
    front end <--PULL-- [output thread] <- output_queue <-
"""

from __future__ import annotations

import logging
import os
import queue
import signal
import threading
from typing import Any

import zmq

from minivllm.config import VllmConfig
from minivllm.engine import (
    EngineCoreOutput,
    EngineCoreOutputs,
    EngineCoreReadyResponse,
    EngineCoreRequestType,
    FinishReason,
)
from minivllm.engine.core import EngineCore
from minivllm.engine.exceptions import EngineDeadError
from minivllm.engine.serial_utils import decode_abort, decode_request, decode_step_records, encode

logger = logging.getLogger(__name__)


class EngineCoreProc(EngineCore):
    """An ``EngineCore`` driven by sockets: the busy loop of the core process.

    Args:
        vllm_config: The configuration (built from the same ``EngineArgs`` as the front
            end's).
        input_queue: Decoded client messages, filled by the input thread.
        output_queue: ``EngineCoreOutputs`` to send, drained by the output thread.
    """

    def __init__(
        self, vllm_config: VllmConfig, input_queue: queue.Queue, output_queue: queue.Queue
    ) -> None:
        super().__init__(vllm_config)
        self.input_queue = input_queue
        self.output_queue = output_queue

    def run_busy_loop(self) -> None:
        """Forever: take in every pending message (waiting for one when idle), then step.

        A failed step fails its own requests inside ``step``; only a dead engine (an
        ``EngineDeadError``, or a bug outside the step) leaves the loop.
        """
        while True:
            self._process_input_queue()
            if self.has_work():
                self.output_queue.put(self.step())

    def _process_input_queue(self) -> None:
        while not self.has_work():
            self._handle_client_request(*self.input_queue.get())  # idle: block
        while not self.input_queue.empty():
            self._handle_client_request(*self.input_queue.get_nowait())

    def _handle_client_request(self, kind: EngineCoreRequestType, payload: Any) -> None:
        if kind == EngineCoreRequestType.ADD:
            try:
                self.add_request(payload)
            except ValueError as exc:
                # One bad request fails alone, as an output for it; the core goes on.
                error = EngineCoreOutput(
                    payload.request_id, [], finish_reason=FinishReason.ERROR, stop_reason=str(exc)
                )
                self.output_queue.put(EngineCoreOutputs(outputs=[error]))
        elif kind == EngineCoreRequestType.SHUTDOWN:
            raise SystemExit(0)
        elif kind == EngineCoreRequestType.ABORT:
            self.abort_requests(payload)
            # Nothing else may step for a while: publish the freed blocks now.
            self._publish_idle_state()
        elif kind == EngineCoreRequestType.STEP_RECORDS:
            try:
                self.set_step_records(payload)
            except ValueError as exc:  # the front end checks first; never die of it
                logger.warning("step records: %s", exc)
                return
            self._publish_idle_state()

    def _publish_idle_state(self) -> None:
        """Send the stats now (and, for viewers, a record when no step will follow)."""
        records = []
        if self.step_recorder is not None and not self.has_work():
            records.append(self.step_recorder.idle_record())
        self.output_queue.put(
            EngineCoreOutputs(scheduler_stats=self.scheduler.make_stats(), step_records=records)
        )


def run_engine_core(
    engine_args: dict[str, Any],
    input_address: str,
    output_address: str,
    context: zmq.Context | None = None,
) -> None:
    """The core's entry point: connect, build the engine, report ready, loop.

    Runs as the target of the core process (``context`` None), or of a thread in the
    front end's process with ``inproc://`` addresses on the front end's context. Any
    failure, at start or in a step, is sent to the front end as ``engine_error`` before
    the loop ends, so waiting requests fail instead of hanging.
    """
    from minivllm.engine.arg_utils import EngineArgs

    in_process = context is not None
    context = context or zmq.Context()
    input_queue: queue.Queue = queue.Queue()
    output_queue: queue.Queue = queue.Queue()
    parent = os.getppid()
    stop = threading.Event()
    threads = [
        threading.Thread(
            target=_process_input_socket,
            args=(context, input_address, input_queue, None if in_process else parent, stop),
            name="EngineCoreInput",
            daemon=True,
        ),
        threading.Thread(
            target=_process_output_socket,
            args=(context, output_address, output_queue),
            name="EngineCoreOutput",
            daemon=True,
        ),
    ]
    for t in threads:
        t.start()
    if not in_process:
        # The front end stops us with SIGTERM; unwind through `finally` below.
        signal.signal(signal.SIGTERM, _raise_system_exit)
        signal.signal(signal.SIGINT, signal.SIG_IGN)  # Ctrl-C reaches the front end
    engine: EngineCoreProc | None = None
    try:
        config = EngineArgs(**engine_args).create_engine_config()
        engine = EngineCoreProc(config, input_queue, output_queue)
        output_queue.put(
            EngineCoreReadyResponse(
                config.cache_config.num_kv_blocks or 0, config.model_config.max_model_len
            )
        )
        engine.run_busy_loop()
    except SystemExit:
        pass
    except BaseException as exc:  # noqa: BLE001 (every failure must reach the front end)
        logger.exception("engine core failed")
        reason = exc.reason if isinstance(exc, EngineDeadError) else f"{type(exc).__name__}: {exc}"
        output_queue.put(EngineCoreOutputs(engine_error=reason))
    finally:
        if engine is not None:
            engine.shutdown()
        stop.set()
        output_queue.put(None)  # the output thread sends what is queued, then stops
        for t in threads:
            t.join(timeout=5.0)


def _raise_system_exit(signum: int, frame: Any) -> None:
    raise SystemExit(128 + signum)


def _process_input_socket(
    context: zmq.Context,
    address: str,
    input_queue: queue.Queue,
    parent_pid: int | None,
    stop: threading.Event,
) -> None:
    """Input thread: receive, decode, enqueue. Exits the process if the parent dies."""
    sock = context.socket(zmq.PULL)
    sock.connect(address)
    try:
        while not stop.is_set():
            if not sock.poll(timeout=500):
                if parent_pid is not None and os.getppid() != parent_pid:
                    logger.error("the front end died; the engine core exits")
                    os._exit(1)
                continue
            kind_frame, data = sock.recv_multipart(copy=False)
            kind = EngineCoreRequestType(bytes(kind_frame.buffer))
            if kind == EngineCoreRequestType.ADD:
                payload: Any = decode_request(data.buffer)
            elif kind == EngineCoreRequestType.ABORT:
                payload = decode_abort(data.buffer)
            elif kind == EngineCoreRequestType.STEP_RECORDS:
                payload = decode_step_records(data.buffer)
            else:
                payload = None
            input_queue.put((kind, payload))
    finally:
        sock.close(linger=0)


def _process_output_socket(context: zmq.Context, address: str, output_queue: queue.Queue) -> None:
    """Output thread: encode and send until a ``None`` arrives."""
    sock = context.socket(zmq.PUSH)
    sock.connect(address)
    try:
        while (item := output_queue.get()) is not None:
            sock.send(encode(item), copy=False)
    finally:
        sock.close(linger=2000)
