"""One P4Runtime connection to one switch: arbitration, pipeline, writes and reads.

`Switch` opens the gRPC channel (failing within a few seconds with
`P4RuntimeUnreachableError` when nothing answers), opens the StreamChannel, sends the
master arbitration update and becomes primary (or raises `NotPrimaryError` naming
the primary's election id). Every RPC has a deadline; every gRPC failure becomes a
typed `hysync.controlplane.errors` exception carrying the server's message.

The schema is the P4Info of the pipeline the switch runs: fetched from the switch
on connect (so a fresh CLI process needs no P4Info path), or set by
`push_pipeline`.
"""

from __future__ import annotations

import hashlib
import logging
import queue
import threading
import time
from collections.abc import Callable, Iterable, Sequence
from pathlib import Path
from types import TracebackType

import grpc
from google.rpc import code_pb2, status_pb2
from p4.v1 import p4runtime_pb2 as p4r
from p4.v1 import p4runtime_pb2_grpc as p4r_grpc

from hysync import p4rt_codec
from hysync.controlplane.errors import (
    ControlPlaneError,
    DeadlineExceededError,
    DeviceConfigError,
    NoPipelineError,
    NotPrimaryError,
    P4RuntimeError,
    P4RuntimeUnreachableError,
    error_for,
    status_code,
)
from hysync.controlplane.p4rt import entities as ent
from hysync.controlplane.p4rt.device_config import read_device_config
from hysync.p4schema import Schema
from hysync.tls import ClientTls, channel

log = logging.getLogger(__name__)

DEFAULT_GRPC_ADDR = "127.0.0.1:9559"
# Added to a write's deadline per update: a 20,000-update batch gets 20 s more. Generous
# (the softswitch applies one in well under a second; BMv2 is slower) so that only a
# switch that is hung, not one that is busy, fails a valid batch.
WRITE_SECONDS_PER_UPDATE = 0.001
ElectionId = tuple[int, int]  # (high, low), as p4runtime-shell


def wait_for_server(grpc_addr: str, timeout: float = 30.0,
                    failed: Callable[[], str | None] = lambda: None,
                    tls: ClientTls | None = None) -> None:
    """Block until a gRPC server answers at `grpc_addr` (a switch that is starting).

    `failed` says why waiting is pointless (e.g. the switch process exited) or None.
    Opening a `Switch` only once the port answers avoids retried arbitrations, which a
    switch refuses while the first, half-open stream still holds the election id."""
    deadline = time.monotonic() + timeout
    while True:
        reason = failed()
        if reason:
            raise P4RuntimeUnreachableError(grpc_addr, reason)
        ch = channel(grpc_addr, tls)
        try:
            grpc.channel_ready_future(ch).result(timeout=0.5)
            return
        except grpc.FutureTimeoutError:
            if time.monotonic() > deadline:
                raise P4RuntimeUnreachableError(grpc_addr,
                                                f"no answer after {timeout:g} s") from None
        finally:
            ch.close()


class Switch:
    """A P4Runtime client session with one device. Use as a context manager."""

    def __init__(self, grpc_addr: str = DEFAULT_GRPC_ADDR, *, device_id: int = 1,
                 election_id: ElectionId = (0, 1), schema: Schema | None = None,
                 timeout: float = 5.0, connect_timeout: float = 3.0,
                 pipeline_timeout: float = 60.0, require_primary: bool = True,
                 arbitrate: bool = True, tls: ClientTls | None = None) -> None:
        """Connect; with `arbitrate` (the default) open the stream and become primary
        (`require_primary`) or backup. `arbitrate=False` opens no stream: a read-only
        session (P4Runtime serves reads to anyone) that leaves the primary undisturbed.
        With `tls` the channel is TLS (mutual with a client certificate), else in the clear."""
        self.grpc_addr = grpc_addr
        self.device_id = device_id
        self.election_id = election_id
        self.timeout = timeout
        self.pipeline_timeout = pipeline_timeout
        self.is_primary = False
        # The stream of an arbitrated session ended without close(): the switch restarted
        # or the path to it broke. The channel would reach a restarted switch again, whose
        # tables are not the ones this session knew: every later call raises instead.
        self.lost = False
        self.primary_election_id: ElectionId | None = None
        # (updates, seconds, ok) of every Write: hysync serve's metrics time them.
        self.on_write: Callable[[int, float, bool], None] | None = None
        self._schema = schema
        self._closed = False
        self._requests: queue.Queue[p4r.StreamMessageRequest | None] = queue.Queue()
        self._arbitration: queue.Queue[p4r.StreamMessageResponse | grpc.RpcError | None] = \
            queue.Queue()
        self._channel = channel(grpc_addr, tls)
        try:
            grpc.channel_ready_future(self._channel).result(timeout=connect_timeout)
        except grpc.FutureTimeoutError:
            self._channel.close()
            # A TLS handshake the switch refuses looks the same to the client as silence.
            hint = (" (over TLS: does the switch serve TLS with a certificate --cacert "
                    "signed, and accept this --cert?)" if tls else
                    " (if the switch serves TLS, give --cacert, --cert and --private-key)")
            raise P4RuntimeUnreachableError(
                grpc_addr, f"no answer within {connect_timeout:g} s{hint}") from None
        self._stub = p4r_grpc.P4RuntimeStub(self._channel)
        self._write_bytes = self._channel.unary_unary(  # a WriteRequest already serialized
            "/p4.v1.P4Runtime/Write", request_serializer=None,
            response_deserializer=p4r.WriteResponse.FromString)
        self._stream: grpc.Future | None = None
        self._receiver: threading.Thread | None = None
        try:
            if arbitrate:
                self._stream = self._stub.StreamChannel(iter(self._requests.get, None))
                self._receiver = threading.Thread(target=self._receive, daemon=True,
                                                  name=f"p4rt-stream-{grpc_addr}")
                self._receiver.start()
                self._arbitrate(require_primary)
            if self._schema is None:
                self._schema = self.fetch_schema()
        except BaseException:
            self.close()
            raise

    # ------------------------------------------------------------ session
    def _receive(self) -> None:
        assert self._stream is not None
        try:
            for msg in self._stream:  # type: ignore[attr-defined]
                if msg.HasField("arbitration"):
                    self._note_arbitration(msg.arbitration)
                    self._arbitration.put(msg)
                elif msg.HasField("error"):
                    log.warning("switch %s reported a stream error: %s", self.grpc_addr,
                                msg.error.message)
        except grpc.RpcError as err:
            if not self._closed:
                self._arbitration.put(err)
        finally:
            self.is_primary = False
            self.lost = not self._closed
            self._arbitration.put(None)

    def _check_session(self) -> None:
        if self.lost:
            raise P4RuntimeUnreachableError(
                self.grpc_addr, "the P4Runtime session ended: the switch restarted or the "
                "connection broke; open a new session")

    def _note_arbitration(self, update: p4r.MasterArbitrationUpdate) -> None:
        self.primary_election_id = (update.election_id.high, update.election_id.low)
        was = self.is_primary
        self.is_primary = update.status.code == code_pb2.OK
        if was and not self.is_primary:
            log.warning("switch %s: this controller is no longer primary (primary is %s)",
                        self.grpc_addr, self.primary_election_id)

    def _arbitrate(self, require_primary: bool) -> None:
        request = p4r.StreamMessageRequest()
        request.arbitration.device_id = self.device_id
        request.arbitration.election_id.high = self.election_id[0]
        request.arbitration.election_id.low = self.election_id[1]
        self._requests.put(request)
        try:
            reply = self._arbitration.get(timeout=self.timeout)
        except queue.Empty:
            raise DeadlineExceededError(
                f"the switch at {self.grpc_addr} did not answer the arbitration update within "
                f"{self.timeout:g} s: is it a P4Runtime server?") from None
        if reply is None:
            raise P4RuntimeUnreachableError(self.grpc_addr, "the stream closed during arbitration")
        if isinstance(reply, grpc.RpcError):
            # INVALID_ARGUMENT: another live stream uses this election id (P4Runtime §5.3)
            if reply.code() in (grpc.StatusCode.ALREADY_EXISTS, grpc.StatusCode.INVALID_ARGUMENT,
                                grpc.StatusCode.PERMISSION_DENIED):
                raise NotPrimaryError(self.grpc_addr, self.device_id, self.election_id, None,
                                      reply.details() or "")
            raise self._map(reply, "arbitration")
        if not self.is_primary and require_primary:
            # NOT_FOUND: no primary now, the switch's remembered election id is above ours.
            live = reply.arbitration.status.code != code_pb2.NOT_FOUND
            raise NotPrimaryError(self.grpc_addr, self.device_id, self.election_id,
                                  self.primary_election_id, reply.arbitration.status.message,
                                  live=live)

    def close(self) -> None:
        """End the stream (the switch then elects another primary) and close the channel.

        Returns once the switch has ended the stream, i.e. released this session's election
        id: a session opened right after with the same id (the next `hysync` command of a
        script) is not refused as a second live controller. A cancelled stream would be
        released whenever the switch's server got round to noticing it, which on a busy
        machine is after the next session's arbitration."""
        if self._closed:
            return
        self._closed = True
        self._requests.put(None)  # half-close: the switch drops our arbitration, then ends
        if self._receiver is not None:
            self._receiver.join(timeout=self.timeout)
        if self._stream is not None:
            self._stream.cancel()  # a switch that did not end the stream within the timeout
        if self._receiver is not None:
            self._receiver.join(timeout=self.timeout)
        self._channel.close()

    def __enter__(self) -> Switch:
        return self

    def __exit__(self, exc_type: type[BaseException] | None, exc: BaseException | None,
                 tb: TracebackType | None) -> None:
        self.close()

    # ------------------------------------------------------------ pipeline
    @property
    def schema(self) -> Schema:
        """The P4Info of the switch's pipeline; NoPipelineError if it has none."""
        if self._schema is None:
            raise NoPipelineError(self.grpc_addr)
        return self._schema

    @property
    def has_pipeline(self) -> bool:
        return self._schema is not None

    def fetch_schema(self) -> Schema | None:
        """The pipeline's P4Info as the switch reports it, or None when it has no pipeline."""
        return self.fetch_pipeline()[0]

    def fetch_pipeline(self) -> tuple[Schema | None, int]:
        """(P4Info, cookie) of the switch's pipeline; (None, 0) when it has none."""
        self._check_session()
        request = p4r.GetForwardingPipelineConfigRequest(
            device_id=self.device_id,
            response_type=p4r.GetForwardingPipelineConfigRequest.P4INFO_AND_COOKIE)
        try:
            reply = self._stub.GetForwardingPipelineConfig(request, timeout=self.timeout)
        except grpc.RpcError as err:
            if err.code() in (grpc.StatusCode.FAILED_PRECONDITION, grpc.StatusCode.NOT_FOUND):
                return None, 0
            raise self._map(err, "get pipeline") from None
        if not reply.config.p4info.tables:
            return None, 0
        return Schema(reply.config.p4info), reply.config.cookie.cookie

    def push_pipeline(self, p4info: str | Path | Schema,
                      device_config_path: str | Path | None = None, *,
                      target: str = "bmv2") -> Schema:
        """Install a pipeline (VERIFY_AND_COMMIT): the P4Info (a text file, or its Schema)
        and, for BMv2 or a Tofino (`target`), the compiler output it packs into the device
        config (controlplane/p4rt/device_config.py). The switch clears every entry and register."""
        self._check_session()
        schema = p4info if isinstance(p4info, Schema) else Schema.from_file(p4info)
        device_config = b""
        if device_config_path is not None:
            device_config = read_device_config(device_config_path, target)
        request = p4r.SetForwardingPipelineConfigRequest(
            device_id=self.device_id, election_id=self._election(),
            action=p4r.SetForwardingPipelineConfigRequest.VERIFY_AND_COMMIT)
        request.config.p4info.CopyFrom(schema.p4info)
        request.config.p4_device_config = device_config
        request.config.cookie.cookie = pipeline_cookie(schema, device_config)
        try:
            self._stub.SetForwardingPipelineConfig(request, timeout=self.pipeline_timeout)
        except grpc.RpcError as err:
            raise self._map(err, "set pipeline") from None
        self._schema = schema
        return schema

    # ------------------------------------------------------------ writes
    def write(self, updates: Iterable[ent.Update]) -> None:
        """Send the updates in one WriteRequest; raise the first failure's typed error,
        listing every failed update (`error.failures` holds their indexes)."""
        self._check_session()
        updates = list(updates)
        if not updates:
            return
        schema = self.schema
        # Encoded straight to bytes (hysync/p4rt_codec.py): the pure-Python protobuf takes
        # ~1 ms per update to build and serialize a WriteRequest.
        request = p4rt_codec.WriteRequest(self.device_id, election_id=self.election_id,
                                    atomicity=p4r.WriteRequest.CONTINUE_ON_ERROR)
        data = p4rt_codec.encode_write_request(
            request, [p4rt_codec.encode_update(u.record(schema)) for u in updates])
        timeout = self.write_deadline(len(updates))
        start, ok = time.perf_counter(), False
        try:
            self._write_bytes(data, timeout=timeout)
            ok = True
        except grpc.RpcError as err:
            if err.code() == grpc.StatusCode.DEADLINE_EXCEEDED:
                raise DeadlineExceededError(
                    f"the switch at {self.grpc_addr} did not apply a write of {len(updates)} "
                    f"update(s) within {timeout:g} s ({self.timeout:g} s, --timeout, plus "
                    f"{WRITE_SECONDS_PER_UPDATE * 1000:g} ms per update); it may be overloaded "
                    "or hung: raise --timeout or split the batch") from None
            raise self._write_error(err, updates) from None
        finally:
            if self.on_write is not None:
                self.on_write(len(updates), time.perf_counter() - start, ok)

    def write_deadline(self, updates: int) -> float:
        """Seconds a write of `updates` updates may take: the session's timeout, plus time
        in proportion to the batch so that a valid big batch is not cut off."""
        return self.timeout + updates * WRITE_SECONDS_PER_UPDATE

    def _write_error(self, err: grpc.RpcError, updates: Sequence[ent.Update]) -> ControlPlaneError:
        failures = _write_failures(err)
        if not failures:
            return self._map(err, "write")
        # A switch that applies a batch all-or-none marks the valid updates ABORTED:
        # name the updates that caused the refusal.
        causes = [f for f in failures if f[1] != "ABORTED"] or failures
        parts = [f"{updates[i]}: {code} {msg}".rstrip() for i, code, msg in causes
                 if i < len(updates)]
        message = (f"the switch refused {len(causes)} of {len(updates)} update(s): "
                   + "; ".join(parts))
        return error_for(grpc.StatusCode[causes[0][1]], message, tuple(failures))

    # ------------------------------------------------------------ reads
    def read(self, queries: Iterable[p4r.Entity]) -> list[p4r.Entity]:
        """One ReadRequest with every query entity; the entities the switch returns."""
        self._check_session()
        request = p4r.ReadRequest(device_id=self.device_id)
        request.entities.extend(queries)
        found: list[p4r.Entity] = []
        try:
            for reply in self._stub.Read(request, timeout=self.timeout):
                found.extend(reply.entities)
        except grpc.RpcError as err:
            raise self._map(err, "read") from None
        return found

    def read_tables(self, names: Sequence[str]) -> dict[str, list[ent.TableEntry]]:
        """Several tables in one Read RPC, keyed by full table name."""
        schema = self.schema
        found: dict[str, list[ent.TableEntry]] = {schema.table(n).name: [] for n in names}
        for e in self.read([ent.table_query(schema, n) for n in names]):
            if e.HasField("table_entry"):
                entry = ent.TableEntry.decode(e, schema)
                found.setdefault(entry.table, []).append(entry)
        return found

    def read_counter_cells(self, cells: Sequence[tuple[str, int | None]]) -> list[ent.CounterCell]:
        """Many (counter, index) cells in one Read RPC."""
        schema = self.schema
        return [ent.CounterCell.decode(e, schema)
                for e in self.read([ent.counter_query(schema, n, i) for n, i in cells])
                if e.HasField("counter_entry")]

    def read_groups(self) -> list[ent.MulticastGroup]:
        """Every multicast group of the packet replication engine."""
        return [ent.MulticastGroup.decode(e)
                for e in self.read([ent.groups_query()])
                if e.HasField("packet_replication_engine_entry")]

    # ------------------------------------------------------------ helpers
    def _election(self) -> p4r.Uint128:
        return p4r.Uint128(high=self.election_id[0], low=self.election_id[1])

    def _map(self, err: grpc.RpcError, what: str) -> ControlPlaneError:
        code, details = err.code(), err.details() or ""
        if code == grpc.StatusCode.UNAVAILABLE:
            return P4RuntimeUnreachableError(self.grpc_addr,
                                             f"{what}: {details}" if details else what)
        if code == grpc.StatusCode.DEADLINE_EXCEEDED:
            return DeadlineExceededError(
                f"the switch at {self.grpc_addr} did not answer {what} within the deadline "
                f"({details or 'timeout'}); it may be overloaded or hung")
        if code == grpc.StatusCode.PERMISSION_DENIED and what in ("write", "set pipeline"):
            return NotPrimaryError(self.grpc_addr, self.device_id, self.election_id,
                                   self.primary_election_id, details)
        return error_for(code, f"the switch refused the {what}: {code.name}: {details}")


def pipeline_cookie(schema: Schema, device_config: bytes = b"") -> int:
    """The cookie `push_pipeline` gives a pipeline: its identity when read back."""
    digest = hashlib.sha256(schema.p4info.SerializeToString() + device_config).digest()
    return int.from_bytes(digest[:8], "big")


def _write_failures(err: grpc.RpcError) -> list[tuple[int, str, str]]:
    """Per-update errors from the google.rpc.Status in the trailing metadata (P4Runtime §12)."""
    trailers = getattr(err, "trailing_metadata", lambda: None)() or ()
    for key, value in trailers:
        if key != "grpc-status-details-bin":
            continue
        status = status_pb2.Status()
        status.ParseFromString(value)
        failures = []
        for i, detail in enumerate(status.details):
            error = p4r.Error()
            if detail.Unpack(error) and error.canonical_code != code_pb2.OK:
                failures.append((i, status_code(error.canonical_code).name, error.message))
        return failures
    return []


def parse_election_id(text: str) -> ElectionId:
    """'5' -> (0, 5); 'high,low' -> (high, low), as p4runtime-shell's --election-id."""
    parts = text.split(",")
    try:
        values = [int(p.strip(), 0) for p in parts]
    except ValueError:
        values = []
    if len(values) not in (1, 2) or any(v < 0 or v >> 64 for v in values):
        raise ValueError(f"election id {text!r} must be a number or 'high,low' "
                         "(unsigned 64-bit each)")
    return (0, values[0]) if len(values) == 1 else (values[0], values[1])


__all__ = ["DEFAULT_GRPC_ADDR", "DeviceConfigError", "ElectionId", "P4RuntimeError", "Switch",
           "parse_election_id", "pipeline_cookie"]
