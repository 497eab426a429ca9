"""Arbitration for the softswitch's server: primary/backup election per role (spec §5).

Each StreamChannel is a `Stream` with its arbitration triple; the `Arbiter` elects the
highest election id of each role as primary, tells every stream of the role when that
changes, and is asked by Write and SetForwardingPipelineConfig whether a request comes
from the primary.
"""

from __future__ import annotations

import threading
from collections.abc import Callable, Iterable

import grpc
from google.rpc import code_pb2
from p4.v1 import p4runtime_pb2 as p4r

from hysync.softswitch.p4status import P4RuntimeError, election_text, role_text, uint128


class Stream:
    """One StreamChannel: its arbitration triple and the queue its handler sends from."""

    def __init__(self, send: Callable[[p4r.StreamMessageResponse], None]) -> None:
        self.send = send
        self.device_id: int | None = None  # set by the first MasterArbitrationUpdate
        self.role = ""
        self.election_id: int | None = None
        # Why this client may not be elected (the switch's --writer list leaves it out);
        # it may still arbitrate without an election id, as an observer.
        self.refusal: P4RuntimeError | None = None


class Arbiter:
    """Primary/backup election per role (P4Runtime spec §5), for one device."""

    def __init__(self, device_id: int) -> None:
        self.device_id = device_id
        self._lock = threading.Lock()
        self._streams: dict[str, list[Stream]] = {}
        self._primary: dict[str, Stream] = {}
        self._highest: dict[str, int] = {}  # highest election id ever seen (election_id_past)

    def update(self, stream: Stream, msg: p4r.MasterArbitrationUpdate) -> P4RuntimeError | None:
        """Apply one MasterArbitrationUpdate; an error means: terminate the stream with it."""
        role = msg.role.name
        election_id = uint128(msg.election_id) if msg.HasField("election_id") else None
        if election_id is not None and stream.refusal is not None:
            return stream.refusal
        if msg.role.HasField("config"):
            return P4RuntimeError(grpc.StatusCode.INVALID_ARGUMENT,
                                  "role.config is not supported by the softswitch: leave it unset "
                                  "(every role has full pipeline access)")
        with self._lock:
            if stream.device_id is None:
                if msg.device_id != self.device_id:
                    return P4RuntimeError(grpc.StatusCode.NOT_FOUND,
                                          f"unknown device id {msg.device_id}: this softswitch is "
                                          f"device {self.device_id} (--device-id)")
                error = self._check_unique(stream, role, election_id)
                if error:
                    return error
                stream.device_id, stream.role = msg.device_id, role
                self._streams.setdefault(role, []).append(stream)
            else:
                if msg.device_id != stream.device_id:
                    return P4RuntimeError(grpc.StatusCode.FAILED_PRECONDITION,
                                          f"this stream arbitrates for device {stream.device_id}, "
                                          f"not {msg.device_id}: open another stream")
                if role != stream.role:
                    return P4RuntimeError(grpc.StatusCode.FAILED_PRECONDITION,
                                          f"this stream has role {stream.role!r}, not {role!r}: "
                                          "to change role, close it and open another stream")
                error = self._check_unique(stream, role, election_id)
                if error:
                    return error
            stream.election_id = election_id
            self._elect(stream)
        return None

    def _check_unique(self, stream: Stream, role: str,
                      election_id: int | None) -> P4RuntimeError | None:
        if election_id is None:
            return None
        for other in self._streams.get(role, ()):
            if other is not stream and other.election_id == election_id:
                return P4RuntimeError(grpc.StatusCode.INVALID_ARGUMENT,
                                      f"election id {election_text(election_id)} is already used "
                                      f"by another live controller for device {self.device_id}"
                                      f"{role_text(role)}: pick a unique one")
        return None

    def _elect(self, stream: Stream) -> None:
        role, election_id = stream.role, stream.election_id
        past = self._highest.get(role)
        if election_id is not None and (past is None or election_id >= past):
            self._highest[role] = election_id
            self._primary[role] = stream
            self._notify(role, self._streams[role])
        elif self._primary.get(role) is stream:  # the primary downgraded itself
            del self._primary[role]
            self._notify(role, self._streams[role])
        else:
            self._notify(role, [stream])

    def remove(self, stream: Stream) -> None:
        """A stream closed: it releases its role; if it was primary, the others learn it."""
        with self._lock:
            streams = self._streams.get(stream.role, [])
            if stream not in streams:
                return
            streams.remove(stream)
            if self._primary.get(stream.role) is stream:
                del self._primary[stream.role]
                self._notify(stream.role, streams)

    def _notify(self, role: str, streams: Iterable[Stream]) -> None:
        primary = self._primary.get(role)
        past = self._highest.get(role)
        for stream in streams:
            msg = p4r.MasterArbitrationUpdate(device_id=self.device_id)
            if role:
                msg.role.name = role
            if past is not None:
                msg.election_id.high, msg.election_id.low = past >> 64, past & (1 << 64) - 1
            if stream is primary:
                msg.status.code, msg.status.message = code_pb2.OK, "you are the primary"
            elif primary is not None:
                msg.status.code = code_pb2.ALREADY_EXISTS
                msg.status.message = (f"backup: the primary has election id "
                                      f"{election_text(primary.election_id)}")
            else:
                msg.status.code = code_pb2.NOT_FOUND
                msg.status.message = ("no primary: send an election id >= "
                                      f"{election_text(past)} to become primary")
            stream.send(p4r.StreamMessageResponse(arbitration=msg))

    def check_primary(self, role: str, election_id: int | None) -> None:
        """Raise PERMISSION_DENIED unless `election_id` is the primary's for `role`."""
        with self._lock:
            primary = self._primary.get(role)
            if primary is None:
                raise P4RuntimeError(
                    grpc.StatusCode.PERMISSION_DENIED,
                    f"no primary controller for device {self.device_id}{role_text(role)}: open a "
                    "StreamChannel and send a MasterArbitrationUpdate with an election id >= "
                    f"{election_text(self._highest.get(role, 0))} first")
            if election_id != primary.election_id:
                raise P4RuntimeError(
                    grpc.StatusCode.PERMISSION_DENIED,
                    f"election id {election_text(election_id)} is not the primary's: the primary "
                    f"for device {self.device_id}{role_text(role)} has election id "
                    f"{election_text(primary.election_id)}; only the primary may write (send a "
                    "MasterArbitrationUpdate with a higher election id to take over)")

    def is_primary(self, stream: Stream) -> bool:
        with self._lock:
            return self._primary.get(stream.role) is stream

