"""How a front end reaches the engine core: a direct call, or ZeroMQ to another process.

Upstream counterpart: ``vllm/v1/engine/core_client.py`` (``EngineCoreClient``,
``InprocClient``, ``MPClient``, ``AsyncMPClient``). Both clients have the same four
verbs (add a request, abort requests, get the next outputs, shut down), so the front
ends do not care where the core runs:

* ``InprocClient`` calls an ``EngineCore`` in the caller's thread; ``get_output()`` *is*
  one step. ``LLM`` uses it: offline there is nothing to overlap the core with.
* ``AsyncMPClient`` starts ``run_engine_core`` in a process of its own (or, with
  ``in_thread=True``, in a thread, for notebooks and tests) and talks to it over two
  ZeroMQ sockets: PUSH requests in, PULL outputs back. The core steps on its own; the
  client only waits for what it sends. ``AsyncLLM`` uses it.
"""

from __future__ import annotations

import contextlib
import dataclasses
import multiprocessing
import os
import tempfile
import threading
import uuid
import weakref
from typing import Any

import zmq
import zmq.asyncio

from minivllm.config import VllmConfig
from minivllm.engine import (
    EngineCoreOutputs,
    EngineCoreReadyResponse,
    EngineCoreRequest,
    EngineCoreRequestType,
)
from minivllm.engine.core import EngineCore
from minivllm.engine.core_proc import run_engine_core
from minivllm.engine.exceptions import EngineDeadError
from minivllm.engine.serial_utils import decode_outputs, encode

# How often a waiting client checks that the core is still alive.
_LIVENESS_POLL_MS = 500


class InprocClient:
    """The engine core in the caller's process and thread; each output is one step."""

    def __init__(self, vllm_config: VllmConfig) -> None:
        self.engine_core = EngineCore(vllm_config)

    @property
    def num_kv_blocks(self) -> int:
        """The KV pool's size, as the core sized it."""
        return self.engine_core.kv_cache_manager.num_blocks

    def get_output(self) -> EngineCoreOutputs:
        """Run one step and return its outputs."""
        return self.engine_core.step()

    def add_request(self, request: EngineCoreRequest) -> None:
        """Queue a request (``ValueError`` if the scheduler refuses it)."""
        self.engine_core.add_request(request)

    def abort_requests(self, request_ids: list[str]) -> None:
        """Abort requests and free their blocks."""
        self.engine_core.abort_requests(request_ids)

    def reset_prefix_cache(self) -> bool:
        """Forget every cached prefix (False while requests hold blocks)."""
        return self.engine_core.reset_prefix_cache()

    def collective_rpc(self, method: Any, args: tuple = (), kwargs: dict | None = None) -> list:
        """Run a method on every model worker."""
        return self.engine_core.collective_rpc(method, args, kwargs)

    def set_step_records(self, interval_s: float | None) -> None:
        """Attach a ``StepRecord`` to outputs at most every ``interval_s`` s; None: stop."""
        self.engine_core.set_step_records(interval_s)

    def shutdown(self) -> None:
        """Stop the model's worker processes, if any."""
        self.engine_core.shutdown()


class AsyncMPClient:
    """The engine core behind ZeroMQ, for an asyncio front end.

    Args:
        engine_args: The engine arguments, as a dict of plain values: the core rebuilds
            its configuration from them (nothing richer crosses to the new process).
        in_thread: Run the core in a thread of this process instead of a new process
            (same sockets, ``inproc://`` transport): for notebooks and tests.
        startup_timeout: Seconds to wait for the core to load the model and report.

    Raises:
        RuntimeError: The core failed to start (its error is in the message).
    """

    def __init__(
        self, engine_args: dict[str, Any], in_thread: bool = False, startup_timeout: float = 600.0
    ) -> None:
        self.ctx = zmq.asyncio.Context()
        self._tmpdir: tempfile.TemporaryDirectory | None = None
        if in_thread:
            base = f"inproc://minivllm-{uuid.uuid4().hex}"
            in_addr, out_addr = f"{base}-input", f"{base}-output"
        else:
            self._tmpdir = tempfile.TemporaryDirectory(prefix="minivllm-core-")
            in_addr = f"ipc://{self._tmpdir.name}/input"
            out_addr = f"ipc://{self._tmpdir.name}/output"
        self.input_socket = self.ctx.socket(zmq.PUSH)
        self.input_socket.bind(in_addr)
        self.output_socket = self.ctx.socket(zmq.PULL)
        self.output_socket.bind(out_addr)
        self.proc: multiprocessing.process.BaseProcess | None = None
        self.thread: threading.Thread | None = None
        if in_thread:
            shared = zmq.Context.shadow(self.ctx.underlying)  # inproc needs one context
            self.thread = threading.Thread(
                target=run_engine_core,
                args=(engine_args, in_addr, out_addr, shared),
                name="EngineCore",
                daemon=True,
            )
            self.thread.start()
        else:
            # spawn, not fork: this process has threads (asyncio, ZeroMQ) that a fork
            # would copy in whatever state they are in.
            self.proc = multiprocessing.get_context("spawn").Process(
                target=run_engine_core,
                args=(engine_args, in_addr, out_addr),
                name="EngineCore",
            )
            self.proc.start()
        self._dead_reason: str | None = None
        self._closed = False
        self._finalizer = weakref.finalize(self, _stop_core, self.proc, self.thread)
        try:
            ready = self._wait_for_ready(startup_timeout)
        except BaseException:
            self.shutdown()
            raise
        self.num_kv_blocks = ready.num_kv_blocks
        self.max_model_len = ready.max_model_len

    @property
    def pid(self) -> int | None:
        """The core process's id (None when it runs in a thread)."""
        return None if self.proc is None else self.proc.pid

    def is_alive(self) -> bool:
        """Whether the core's process (or thread) still runs."""
        runner = self.proc if self.proc is not None else self.thread
        return runner is not None and runner.is_alive()

    def _wait_for_ready(self, timeout: float) -> EngineCoreReadyResponse:
        # A synchronous view of the same socket: the constructor is not a coroutine.
        sock = zmq.Socket.shadow(self.output_socket.underlying)
        waited = 0.0
        while not sock.poll(_LIVENESS_POLL_MS):
            waited += _LIVENESS_POLL_MS / 1000
            if not self.is_alive():
                code = None if self.proc is None else self.proc.exitcode
                raise RuntimeError(f"the engine core exited during start-up (exit code {code})")
            if waited > timeout:
                raise RuntimeError(f"the engine core did not start within {timeout:.0f} s")
        message = decode_outputs(sock.recv())
        if isinstance(message, EngineCoreOutputs):
            raise RuntimeError(f"the engine core failed to start: {message.engine_error}")
        return message

    # ---- the four verbs ---------------------------------------------------------------

    async def add_request_async(self, request: EngineCoreRequest) -> None:
        """Send a request to the core."""
        await self._send(EngineCoreRequestType.ADD, encode(request))

    async def abort_requests_async(self, request_ids: list[str]) -> None:
        """Ask the core to abort requests."""
        if request_ids:
            await self._send(EngineCoreRequestType.ABORT, encode(list(request_ids)))

    async def set_step_records_async(self, interval_s: float | None) -> None:
        """Ask the core to attach a ``StepRecord`` to its outputs at most every
        ``interval_s`` seconds (it sends one of its idle state at once), or to stop
        (None)."""
        await self._send(EngineCoreRequestType.STEP_RECORDS, encode(interval_s))

    async def get_output_async(self) -> EngineCoreOutputs:
        """Wait for the core's next outputs.

        Raises:
            EngineDeadError: The core reported a failure, or its process died.
        """
        while True:
            self._check_alive()
            if await self.output_socket.poll(_LIVENESS_POLL_MS):
                break
            if not self.is_alive():
                self._dead_reason = self._dead_reason or "the engine core process died"
        message = decode_outputs(await self.output_socket.recv())
        if isinstance(message, EngineCoreReadyResponse):  # never after start-up
            raise EngineDeadError("unexpected ready message from the engine core")
        if message.engine_error is not None:
            self._dead_reason = message.engine_error
            self._check_alive()
        return message

    def shutdown(self) -> None:
        """Stop the core (politely, then by force) and close the sockets. Idempotent."""
        if self._closed:
            return
        self._closed = True
        if self.is_alive():
            # A synchronous view of the socket: shutdown may run outside any event loop.
            sock = zmq.Socket.shadow(self.input_socket.underlying)
            with contextlib.suppress(zmq.ZMQError):
                sock.send_multipart([EngineCoreRequestType.SHUTDOWN.value, b""], zmq.NOBLOCK)
        self._finalizer()
        self.input_socket.close(linger=0)
        self.output_socket.close(linger=0)
        if not self.is_alive():  # a core thread still holding sockets would block term()
            self.ctx.term()
        if self._tmpdir is not None:
            self._tmpdir.cleanup()

    # ---- helpers ----------------------------------------------------------------------

    def _check_alive(self) -> None:
        if self._dead_reason is not None:
            raise EngineDeadError(self._dead_reason)

    async def _send(self, kind: EngineCoreRequestType, data: bytes) -> None:
        self._check_alive()
        if not self.is_alive():
            self._dead_reason = "the engine core process died"
            self._check_alive()
        await self.input_socket.send_multipart([kind.value, data], copy=False)


def _stop_core(
    proc: multiprocessing.process.BaseProcess | None, thread: threading.Thread | None
) -> None:
    """Wait for the core to stop after SHUTDOWN; terminate (then kill) a process that
    does not. Also runs at garbage collection and interpreter exit."""
    if thread is not None:
        thread.join(timeout=10.0)
    if proc is None:
        return
    proc.join(timeout=5.0)
    if proc.is_alive():
        proc.terminate()  # SIGTERM: the core unwinds and stops its workers
        proc.join(timeout=5.0)
    if proc.is_alive():
        os.kill(proc.pid, 9)
        proc.join(timeout=1.0)


def engine_args_to_dict(engine_args: Any) -> dict[str, Any]:
    """The dataclass ``EngineArgs`` as a dict of plain values for the core process."""
    return dataclasses.asdict(engine_args)

