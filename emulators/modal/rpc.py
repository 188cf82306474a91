"""What every RPC of the Modal emulator shares: faults as gRPC errors, credentials, gaps.

* `fault_error` turns a harness `FaultSpec` into the gRPC status Modal's
  servers answer (401 UNAUTHENTICATED, 403 PERMISSION_DENIED, 404
  NOT_FOUND, 429 RESOURCE_EXHAUSTED with an ``RPCRetryPolicy`` detail when
  the fault has a retry-after, 500 INTERNAL, 502/503 UNAVAILABLE, 504
  DEADLINE_EXCEEDED); `apply_fault` also plays delays, hangs and drops,
  before the work or (``after``) once it is done.
* `DetailsCodec` encodes error details the way the SDK's channel decodes
  them (an ``api_pb2.RPCStatus`` with ``type.modal.com/`` Any URLs).
* `fill_unimplemented` completes a server base class: every RPC the
  emulator does not play answers UNIMPLEMENTED and is logged by name.
"""

from __future__ import annotations

import abc
import asyncio
from collections.abc import Sequence
from typing import Any, TypeVar

import structlog
from google.protobuf.message import Message  # type: ignore[import-untyped]
from grpclib import GRPCError, Status
from grpclib.encoding.base import StatusDetailsCodecBase
from grpclib.server import Stream
from modal_proto import api_pb2

from emulators.harness import FaultBook, FaultSpec, apply_delay_or_hang

__all__ = [
    "DetailsCodec",
    "apply_fault",
    "fault_error",
    "fill_unimplemented",
    "metadata_value",
]

log = structlog.get_logger("sandbox_router.emulators.modal")

T = TypeVar("T", bound=abc.ABCMeta)

_STATUSES = {
    400: Status.INVALID_ARGUMENT,
    401: Status.UNAUTHENTICATED,
    403: Status.PERMISSION_DENIED,
    404: Status.NOT_FOUND,
    409: Status.FAILED_PRECONDITION,
    429: Status.RESOURCE_EXHAUSTED,
    500: Status.INTERNAL,
    501: Status.UNIMPLEMENTED,
    502: Status.UNAVAILABLE,
    503: Status.UNAVAILABLE,
    504: Status.DEADLINE_EXCEEDED,
}
_MESSAGES = {
    Status.UNAUTHENTICATED: "Token ID or secret is invalid. Please run `modal token new`.",
    Status.PERMISSION_DENIED: "Permission denied",
    Status.NOT_FOUND: "Not found",
    Status.RESOURCE_EXHAUSTED: "Sandbox creation rate limit exceeded",
    Status.INTERNAL: "Internal server error",
    Status.UNAVAILABLE: "Service unavailable, please try again",
    Status.DEADLINE_EXCEEDED: "Deadline exceeded",
}


def metadata_value(stream: Stream[Any, Any], key: str) -> str | None:
    value = stream.metadata.get(key) if stream.metadata is not None else None
    return value if isinstance(value, str) else None


def fault_error(fault: FaultSpec) -> GRPCError:
    """The gRPC error Modal answers for a status fault (an HTTP-style status)."""
    status = _STATUSES.get(fault.status or 500)
    if status is None:
        status = Status.INTERNAL if (fault.status or 500) >= 500 else Status.INVALID_ARGUMENT
    details: list[Message] | None = None
    if status is Status.RESOURCE_EXHAUSTED and fault.retry_after is not None:
        details = [api_pb2.RPCRetryPolicy(retry_after_secs=fault.retry_after)]
    return GRPCError(status, fault.message or _MESSAGES.get(status, status.name), details)


async def apply_fault(
    faults: FaultBook, stream: Stream[Any, Any], op: str, key: str | None
) -> None:
    """Play the fault that hits this request, if any: delay, hang, drop or raise its status.

    An ``after`` fault is played once the handler has done the work, when it
    sends its answer: a create the server carried out whose answer is late,
    or lost with the connection.
    """
    fault = faults.take(op, key)
    if fault is None:
        return
    if not fault.after:
        await _play(fault, stream)
        return
    answer = stream.send_message

    async def late_answer(message: Any) -> None:
        stream.send_message = answer  # type: ignore[method-assign]
        await _play(fault, stream)
        await answer(message)

    stream.send_message = late_answer  # type: ignore[method-assign]


async def _play(fault: FaultSpec, stream: Stream[Any, Any]) -> None:
    await apply_delay_or_hang(fault)
    if fault.drop:
        stream._stream._transport.abort()
        await asyncio.Event().wait()
    if fault.status is not None:
        raise fault_error(fault)


class DetailsCodec(StatusDetailsCodecBase):
    """Error details as Modal's servers send them (the SDK decodes ``api_pb2.RPCStatus``)."""

    def encode(
        self, status: Status, message: str | None, details: Sequence[Message] | None
    ) -> bytes:
        body = api_pb2.RPCStatus(code=status.value, message=message or "")
        for detail in details or ():
            body.details.add().Pack(detail, type_url_prefix="type.modal.com/")
        encoded: bytes = body.SerializeToString()
        return encoded

    def decode(self, status: Status, message: str | None, data: bytes) -> Any:
        return list(api_pb2.RPCStatus.FromString(data).details)


def fill_unimplemented(cls: T) -> T:
    """Give every abstract RPC of ``cls`` a handler answering UNIMPLEMENTED.

    Each such call is logged by name and counted in the servicer's
    ``unimplemented`` counter.
    """
    for name in sorted(cls.__abstractmethods__):
        setattr(cls, name, _unimplemented(name))
    cls.__abstractmethods__ = frozenset()
    return cls


def _unimplemented(name: str) -> Any:
    async def handler(self: Any, stream: Stream[Any, Any]) -> None:
        self.unimplemented[name] += 1
        log.warning("sandbox_router.emulators.modal.unimplemented", rpc=name)
        raise GRPCError(Status.UNIMPLEMENTED, f"{name} is not implemented by the Modal emulator")

    handler.__name__ = name
    return handler
