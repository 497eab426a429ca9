"""P4Runtime status for the softswitch's server: the errors it answers with (docs/design.md).

A request the server refuses is a `P4RuntimeError` (a gRPC code and a message that
says what to fix); per-entity failures of a Write or Read batch are a `BatchError`,
sent as UNKNOWN with one p4.v1.Error per entity in the status details (spec §12.3).
"""

from __future__ import annotations

import collections
import logging
from typing import NoReturn

import grpc
from google.rpc import code_pb2, status_pb2
from p4.v1 import p4runtime_pb2 as p4r

log = logging.getLogger(__name__)

_DETAILS_BUDGET = 6 * 1024  # bytes of google.rpc.Status in a trailer, see rich_status


class P4RuntimeError(Exception):
    """A request the server refuses: a grpc status code and a message saying what to fix."""

    def __init__(self, code: grpc.StatusCode, message: str) -> None:
        super().__init__(message)
        self.code = code
        self.message = message



class BatchError(Exception):
    """Per-entity failures of a Write or Read batch: UNKNOWN with one p4.v1.Error each."""

    def __init__(self, summary: str, errors: list[p4r.Error]) -> None:
        super().__init__(summary)
        self.summary = summary
        self.errors = errors



class RichStatus(collections.namedtuple("RichStatus", ("code", "details", "trailing_metadata")),
                 grpc.Status):
    """What context.abort_with_status() takes (grpcio-status's shape, without the dependency)."""


def p4_error(code: grpc.StatusCode, message: str = "") -> p4r.Error:
    return p4r.Error(canonical_code=code.value[0], message=message)


def rich_status(summary: str, errors: list[p4r.Error]) -> RichStatus:
    """UNKNOWN with one p4.v1.Error per entity in the details (spec §12.3).

    The details travel in a trailer, and a gRPC client refuses trailers above its
    max_metadata_size (8 KB by default, 16 KB hard): it would then see a transport
    RESOURCE_EXHAUSTED instead of our answer. Above the budget (batches of ~170+
    entities) the details are left out and the message, which names the failing
    entities, is all the client gets.
    """
    status = status_pb2.Status(code=code_pb2.UNKNOWN, message=summary)
    for error in errors:
        status.details.add().Pack(error)
    if status.ByteSize() > _DETAILS_BUDGET:
        summary += (f" [per-entity details omitted: {len(errors)} of them exceed the 8 KB of "
                    "trailers a gRPC client accepts by default]")
        status = status_pb2.Status(code=code_pb2.UNKNOWN, message=summary)
    return RichStatus(grpc.StatusCode.UNKNOWN, summary,
                       (("grpc-status-details-bin", status.SerializeToString()),))


def internal_error(err: Exception, where: str) -> P4RuntimeError:
    """A bug: reported with what raised it instead of a bare UNKNOWN."""
    log.exception("internal error in %s", where)
    return P4RuntimeError(grpc.StatusCode.INTERNAL,
                          f"internal error in the softswitch ({err!r}); this is a "
                          "bug, please report it with the request")


def abort(context: grpc.ServicerContext, failure: P4RuntimeError | BatchError) -> NoReturn:
    """End the RPC with `failure` (context.abort raises)."""
    if isinstance(failure, BatchError):
        context.abort_with_status(rich_status(failure.summary, failure.errors))
    else:
        context.abort(failure.code, failure.message)
    raise AssertionError("context.abort returned")  # pragma: no cover


def uint128(msg: p4r.Uint128) -> int:
    return msg.high << 64 | msg.low


def election_text(election_id: int | None) -> str:
    if election_id is None:
        return "unset"
    high, low = election_id >> 64, election_id & (1 << 64) - 1
    return str(low) if high == 0 else f"(high={high}, low={low})"


def role_text(role: str) -> str:
    return f" role {role!r}" if role else ""


def unsupported_entity(kind: str | None) -> P4RuntimeError:
    if kind is None:
        return P4RuntimeError(grpc.StatusCode.INVALID_ARGUMENT,
                              "the entity is empty: set table_entry, counter_entry or "
                              "packet_replication_engine_entry")
    if kind == "register_entry":
        return P4RuntimeError(grpc.StatusCode.UNIMPLEMENTED,
                              "registers are data-plane state and not reachable over P4Runtime "
                              "(as on BMv2, docs/protocol.md §8); read the counters instead")
    return P4RuntimeError(grpc.StatusCode.UNIMPLEMENTED,
                          f"{kind} is not supported: the HySync program has only tables, "
                          "counters and multicast groups")
