"""Encoding of the messages between the front end and the engine core.

Upstream counterpart: ``vllm/v1/serial_utils.py`` (``MsgpackEncoder``,
``MsgpackDecoder``). msgspec's msgpack codec turns the typed structs of
``minivllm.engine`` into compact bytes and back, checking every field's type on the
way in. Nothing is pickled: a message can only ever become the type it is decoded as.
Encoders and decoders are built once; msgspec caches each type's layout in them.
"""

from __future__ import annotations

import msgspec

from minivllm.engine import EngineCoreOutputs, EngineCoreReadyResponse, EngineCoreRequest

_encoder = msgspec.msgpack.Encoder()
_request_decoder = msgspec.msgpack.Decoder(EngineCoreRequest)
_abort_decoder = msgspec.msgpack.Decoder(list[str])
_step_records_decoder = msgspec.msgpack.Decoder(float | None)
_outputs_decoder = msgspec.msgpack.Decoder(EngineCoreOutputs | EngineCoreReadyResponse)


def encode(message: object) -> bytes:
    """Any engine message (request, abort list, outputs, ready response) to bytes."""
    return _encoder.encode(message)



def decode_request(data: memoryview | bytes) -> EngineCoreRequest:
    """Bytes from the front end's ADD message to an ``EngineCoreRequest``."""
    return _request_decoder.decode(data)


def decode_abort(data: memoryview | bytes) -> list[str]:
    """Bytes from the front end's ABORT message to the request ids."""
    return _abort_decoder.decode(data)


def decode_step_records(data: memoryview | bytes) -> float | None:
    """Bytes from the front end's STEP_RECORDS message to the interval (None: stop)."""
    return _step_records_decoder.decode(data)


def decode_outputs(data: memoryview | bytes) -> EngineCoreOutputs | EngineCoreReadyResponse:
    """Bytes from the core to a step's outputs (or, first, its ready response)."""
    return _outputs_decoder.decode(data)
