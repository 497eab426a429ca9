"""The softswitch's P4Runtime server: the `p4.v1.P4Runtime` gRPC service around one `Pipeline`.

A controller (controlplane/, p4runtime-shell, any P4Runtime 1.x client) programs the
softswitch exactly as it programs BMv2's simple_switch_grpc: arbitration on the
StreamChannel, SetForwardingPipelineConfig with the P4Info of p4src/v1model/hysync.p4,
then table entries, multicast groups and counters by P4Info id.

The P4Info is checked against the program the pipeline implements (docs/protocol.md §8,
written down below as `TABLE_KEYS`, `TABLE_ACTIONS`, `ACTION_PARAMS` and the pipeline's
own tables and counters): a P4Info of another program is refused instead of being
silently half-served. Requests are then translated from ids and bytestrings to the
names and ints of softswitch.tables.

Deliberate limits: one device; roles are arbitration domains with full pipeline access
(role.config is refused); no packet I/O, digests, meters, action profiles or register
access (the P4 program has none that P4Runtime can reach); DATAPLANE_ATOMIC writes are
UNIMPLEMENTED.
"""

from __future__ import annotations

import collections
import functools
import logging
import queue
import threading
from collections.abc import Callable, Iterable, Iterator
from concurrent import futures
from dataclasses import dataclass, field
from typing import Any

import grpc
from google.rpc import code_pb2, status_pb2
from p4.config.v1 import p4info_pb2
from p4.v1 import p4runtime_pb2 as p4r
from p4.v1 import p4runtime_pb2_grpc

from hysync import p4names
from softswitch.pipeline import Pipeline
from softswitch.tables import Entry, EntryError, Replica

log = logging.getLogger(__name__)

API_VERSION = "1.4.1"
READ_CHUNK = 512  # entities per ReadResponse: bounded messages for 49k-cell counter reads
_DETAILS_BUDGET = 6 * 1024  # bytes of google.rpc.Status in a trailer, see _rich_status
_MAX_MESSAGE = 64 * 1024 * 1024  # big write batches (the spec advises > 4 MB)

EXACT = p4info_pb2.MatchField.EXACT
RANGE = p4info_pb2.MatchField.RANGE
_KIND_NAME = {EXACT: "exact", RANGE: "range"}
TABLE_ONLY = p4info_pb2.ActionRef.TABLE_ONLY
DEFAULT_ONLY = p4info_pb2.ActionRef.DEFAULT_ONLY

# The program the pipeline implements, from the committed P4Info (hysync/p4names.py).
# Key fields and params are in the order the pipeline's Entry.match and Entry.params
# hold them; P4Info ids are mapped onto these positions by name, so a P4Info that
# orders them differently still works. A table's first action is required, the rest allowed.
_MATCH_KIND = {"EXACT": EXACT, "RANGE": RANGE}
TABLE_KEYS: dict[str, tuple[tuple[str, int, int], ...]] = {
    table: tuple((name, bits, _MATCH_KIND[kind]) for name, bits, kind in keys)
    for table, keys in p4names.TABLE_KEYS.items()}
TABLE_ACTIONS = p4names.TABLE_ACTIONS
ACTION_PARAMS = p4names.ACTION_PARAMS
# v1model standard metadata widths: mcast_grp bit<16>, egress_spec bit<9>, egress_rid bit<16>.
MAX_GROUP_ID = 0xFFFF
PORT_BITS = 9
MAX_RID = 0xFFFF


# ------------------------------------------------------------------ errors
class P4RuntimeError(Exception):
    """A request the server refuses: a grpc status code and a message saying what to fix."""

    def __init__(self, code: grpc.StatusCode, message: str) -> None:
        super().__init__(message)
        self.code = code
        self.message = message


class ConfigError(ValueError):
    """A P4Info that does not describe the program the softswitch pipeline implements."""


class _BatchError(Exception):
    """Per-entity failures of a Write or Read batch: UNKNOWN with one p4.v1.Error each."""

    def __init__(self, summary: str, errors: list[p4r.Error]) -> None:
        super().__init__(summary)
        self.summary = summary
        self.errors = errors


class _RichStatus(collections.namedtuple("_RichStatus", ("code", "details", "trailing_metadata")),
                  grpc.Status):
    """What context.abort_with_status() takes (grpcio-status's shape, without the dependency)."""


def _p4_error(code: grpc.StatusCode, message: str = "") -> p4r.Error:
    return p4r.Error(canonical_code=code.value[0], message=message)


def _rich_status(summary: str, errors: list[p4r.Error]) -> _RichStatus:
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
    return _RichStatus(grpc.StatusCode.UNKNOWN, summary,
                       (("grpc-status-details-bin", status.SerializeToString()),))


# ----------------------------------------------------------- bytestrings
def decode_value(raw: bytes, bits: int, what: str) -> int:
    """A P4Runtime bytestring -> int; leading zero bytes are fine if the value fits `bits`."""
    if not raw:
        raise P4RuntimeError(grpc.StatusCode.OUT_OF_RANGE,
                             f"{what}: empty bytestring; send the value big-endian in at "
                             "least 1 byte")
    value = int.from_bytes(raw, "big")
    if value >> bits:
        raise P4RuntimeError(grpc.StatusCode.OUT_OF_RANGE,
                             f"{what}: value 0x{raw.hex()} does not fit in {bits} bits "
                             f"(maximum {(1 << bits) - 1})")
    return value


def encode_value(value: int) -> bytes:
    """The canonical (shortest) P4Runtime bytestring of a non-negative int."""
    return value.to_bytes(max(1, (value.bit_length() + 7) // 8), "big")


def _uint128(msg: p4r.Uint128) -> int:
    return msg.high << 64 | msg.low


def _election_text(election_id: int | None) -> str:
    if election_id is None:
        return "unset"
    high, low = election_id >> 64, election_id & (1 << 64) - 1
    return str(low) if high == 0 else f"(high={high}, low={low})"


def _role_text(role: str) -> str:
    return f" role {role!r}" if role else ""


# ------------------------------------------------------------- the schema
@dataclass(frozen=True, slots=True)
class FieldInfo:
    id: int
    name: str
    bits: int
    kind: int


@dataclass(frozen=True, slots=True)
class ParamInfo:
    id: int
    name: str
    bits: int


@dataclass(frozen=True, slots=True)
class ActionInfo:
    id: int
    name: str
    params: tuple[ParamInfo, ...]  # in Entry.params order
    position: dict[int, int]  # param id -> index in params


@dataclass(frozen=True, slots=True)
class TableInfo:
    id: int
    name: str
    fields: tuple[FieldInfo, ...]  # in Entry.match order
    position: dict[int, int]  # field id -> index in fields
    scopes: dict[int, int]  # action id -> ActionRef scope
    const_default: bool
    initial_default: tuple[str, tuple[int, ...]]
    size: int

    @property
    def needs_priority(self) -> bool:
        return any(f.kind != EXACT for f in self.fields)


@dataclass(frozen=True, slots=True)
class CounterInfo:
    id: int
    name: str
    size: int
    unit: int


@dataclass(slots=True)
class Schema:
    """The P4Info, indexed both ways: ids for requests, names for reads."""

    tables: dict[int, TableInfo] = field(default_factory=dict)
    actions: dict[int, ActionInfo] = field(default_factory=dict)
    counters: dict[int, CounterInfo] = field(default_factory=dict)
    table_ids: dict[str, int] = field(default_factory=dict)
    action_ids: dict[str, int] = field(default_factory=dict)

    def table(self, table_id: int) -> TableInfo:
        table = self.tables.get(table_id)
        if table is None:
            known = ", ".join(f"{t.id} ({t.name})" for t in self.tables.values())
            raise P4RuntimeError(grpc.StatusCode.INVALID_ARGUMENT,
                                 f"unknown table id {table_id}; the P4Info's tables are {known}")
        return table

    def counter(self, counter_id: int) -> CounterInfo:
        counter = self.counters.get(counter_id)
        if counter is None:
            known = ", ".join(f"{c.id} ({c.name})" for c in self.counters.values())
            raise P4RuntimeError(grpc.StatusCode.INVALID_ARGUMENT,
                                 f"unknown counter id {counter_id}; the P4Info's counters are "
                                 f"{known}")
        return counter


_UNSUPPORTED_P4INFO = ("action_profiles", "direct_counters", "meters", "direct_meters",
                       "controller_packet_metadata", "value_sets", "digests")


def check_p4info(p4info: p4info_pb2.P4Info, pipeline: Pipeline,
                 defaults: dict[str, tuple[str, tuple[int, ...]]] | None = None) -> Schema:
    """The schema of `p4info` if it describes the program `pipeline` implements.

    `defaults` is each table's default action as the program defines it (what a
    fresh pipeline has); it defaults to the pipeline's current ones. Raises
    ConfigError naming the first mismatch.
    """
    if defaults is None:
        defaults = {name: (t.default_action, t.default_params)
                    for name, t in pipeline.tables.items()}
    for kind in _UNSUPPORTED_P4INFO:
        objects = getattr(p4info, kind)
        if objects:
            raise ConfigError(f"the P4Info has {kind} ({objects[0].preamble.name}), which the "
                              "softswitch pipeline does not implement: push the P4Info of "
                              "p4src/v1model/hysync.p4")
    schema = Schema()
    ids: dict[int, str] = {}
    for action in p4info.actions:
        _claim_id(ids, action.preamble)
        schema.action_ids[action.preamble.name] = action.preamble.id
    for counter in p4info.counters:
        _claim_id(ids, counter.preamble)
    by_name = {a.preamble.name: a for a in p4info.actions}
    p4_tables = {t.preamble.name: t for t in p4info.tables}
    for name in pipeline.tables:
        if name not in p4_tables:
            raise ConfigError(f"the P4Info has no table {name}, which the softswitch pipeline "
                              "implements: push the P4Info of p4src/v1model/hysync.p4")
    for name, table in p4_tables.items():
        _claim_id(ids, table.preamble)
        if name not in pipeline.tables:
            raise ConfigError(f"P4Info table {name} is not implemented by the softswitch "
                              f"pipeline (its tables: {', '.join(pipeline.tables)})")
        info = _check_table(table, pipeline.tables[name].size, by_name, schema, defaults[name])
        schema.tables[info.id] = info
        schema.table_ids[name] = info.id
    p4_counters = {c.preamble.name: c for c in p4info.counters}
    for name, counter in pipeline.counters.items():
        p4_counter = p4_counters.get(name)
        if p4_counter is None:
            raise ConfigError(f"the P4Info has no counter {name}, which the softswitch pipeline "
                              "implements")
        if p4_counter.size != counter.size:
            raise ConfigError(f"P4Info counter {name} has {p4_counter.size} cells, the softswitch "
                              f"pipeline's has {counter.size}")
        schema.counters[p4_counter.preamble.id] = CounterInfo(
            p4_counter.preamble.id, name, counter.size, p4_counter.spec.unit)
    for name in p4_counters:
        if name not in pipeline.counters:
            raise ConfigError(f"P4Info counter {name} is not implemented by the softswitch "
                              f"pipeline (its counters: {', '.join(pipeline.counters)})")
    return schema


def _claim_id(ids: dict[int, str], preamble: p4info_pb2.Preamble) -> None:
    if preamble.id == 0:
        raise ConfigError(f"P4Info object {preamble.name} has id 0; every id must be non-zero")
    other = ids.setdefault(preamble.id, preamble.name)
    if other != preamble.name:
        raise ConfigError(f"P4Info id {preamble.id} is used by both {other} and {preamble.name}")


def _check_table(table: p4info_pb2.Table, size: int, actions: dict[str, p4info_pb2.Action],
                 schema: Schema, default: tuple[str, tuple[int, ...]]) -> TableInfo:
    name = table.preamble.name
    if table.implementation_id or table.direct_resource_ids:
        raise ConfigError(f"P4Info table {name} has an action profile or direct resources; the "
                          "softswitch implements a direct table without them")
    if table.is_const_table:
        raise ConfigError(f"P4Info table {name} is const; the softswitch's is written at run time")
    if table.size != size:
        raise ConfigError(f"P4Info table {name} has size {table.size}, the softswitch pipeline's "
                          f"has {size}")
    p4_fields = {f.name: f for f in table.match_fields}
    fields = []
    for field_name, bits, kind in TABLE_KEYS[name]:
        f = p4_fields.pop(field_name, None)
        if f is None:
            raise ConfigError(f"P4Info table {name} has no match field {field_name} "
                              f"({bits} bits, {_KIND_NAME[kind]})")
        if f.bitwidth != bits or f.match_type != kind:
            raise ConfigError(
                f"P4Info table {name} match field {field_name} is {f.bitwidth} bits "
                f"{p4info_pb2.MatchField.MatchType.Name(f.match_type)}, the softswitch's is "
                f"{bits} bits {_KIND_NAME[kind].upper()}")
        fields.append(FieldInfo(f.id, field_name, bits, kind))
    if p4_fields:
        raise ConfigError(f"P4Info table {name} has match field {next(iter(p4_fields))}, which "
                          "the softswitch pipeline does not match on")
    if len({f.id for f in fields}) != len(fields):
        raise ConfigError(f"P4Info table {name} has two match fields with the same id")
    allowed = TABLE_ACTIONS[name]
    scopes: dict[int, int] = {}
    refs = {}
    for ref in table.action_refs:
        action = next((a for a in actions.values() if a.preamble.id == ref.id), None)
        if action is None:
            raise ConfigError(f"P4Info table {name} refers to action id {ref.id}, which the "
                              "P4Info does not define")
        if action.preamble.name not in allowed:
            raise ConfigError(f"P4Info table {name} has action {action.preamble.name}; the "
                              f"softswitch's has only {', '.join(allowed)}")
        scopes[ref.id] = ref.scope
        refs[action.preamble.name] = action
    if allowed[0] not in refs:
        raise ConfigError(f"P4Info table {name} lacks action {allowed[0]}")
    for action in refs.values():
        _register_action(action, schema)
    default_id = table.const_default_action_id or table.initial_default_action.action_id
    default_name = (schema.actions[default_id].name if default_id in schema.actions
                    else p4names.NO_ACTION)
    if default_id and default_id not in scopes:
        raise ConfigError(f"P4Info table {name}'s default action id {default_id} is not one of "
                          "its actions")
    if default_name != default[0]:
        raise ConfigError(f"P4Info table {name}'s default action is {default_name}; the "
                          f"softswitch pipeline's is {default[0]}")
    initial = (default_name, _initial_params(table, schema, default_id, default[1]))
    return TableInfo(table.preamble.id, name, tuple(fields),
                     {f.id: i for i, f in enumerate(fields)}, scopes,
                     bool(table.const_default_action_id), initial, size)


def _register_action(action: p4info_pb2.Action, schema: Schema) -> None:
    name = action.preamble.name
    if action.preamble.id in schema.actions:
        return
    p4_params = {p.name: p for p in action.params}
    params = []
    for param_name, bits in ACTION_PARAMS[name]:
        p = p4_params.pop(param_name, None)
        if p is None:
            raise ConfigError(f"P4Info action {name} has no parameter {param_name} ({bits} bits)")
        if p.bitwidth != bits:
            raise ConfigError(f"P4Info action {name} parameter {param_name} is {p.bitwidth} bits, "
                              f"the softswitch's is {bits}")
        params.append(ParamInfo(p.id, param_name, bits))
    if p4_params:
        raise ConfigError(f"P4Info action {name} has parameter {next(iter(p4_params))}, which the "
                          "softswitch's does not take")
    schema.actions[action.preamble.id] = ActionInfo(
        action.preamble.id, name, tuple(params), {p.id: i for i, p in enumerate(params)})


def _initial_params(table: p4info_pb2.Table, schema: Schema, action_id: int,
                    expected: tuple[int, ...]) -> tuple[int, ...]:
    if not table.HasField("initial_default_action") or action_id not in schema.actions:
        return expected
    action = schema.actions[action_id]
    values = [0] * len(action.params)
    for arg in table.initial_default_action.arguments:
        if arg.param_id in action.position:
            values[action.position[arg.param_id]] = int.from_bytes(arg.value, "big")
    if tuple(values) != expected:
        raise ConfigError(f"P4Info table {table.preamble.name}'s default action arguments "
                          f"{tuple(values)} differ from the softswitch pipeline's {expected}")
    return expected


# ------------------------------------------------------------ arbitration
class _Stream:
    """One StreamChannel: its arbitration triple and the queue its handler sends from."""

    def __init__(self, send: Callable[[p4r.StreamMessageResponse], None]) -> None:
        self.send = send
        self.device_id: int | None = None  # set by the first MasterArbitrationUpdate
        self.role = ""
        self.election_id: int | None = None


class Arbiter:
    """Primary/backup election per role (P4Runtime spec §5), for one device."""

    def __init__(self, device_id: int) -> None:
        self.device_id = device_id
        self._lock = threading.Lock()
        self._streams: dict[str, list[_Stream]] = {}
        self._primary: dict[str, _Stream] = {}
        self._highest: dict[str, int] = {}  # highest election id ever seen (election_id_past)

    def update(self, stream: _Stream, msg: p4r.MasterArbitrationUpdate) -> P4RuntimeError | None:
        """Apply one MasterArbitrationUpdate; an error means: terminate the stream with it."""
        role = msg.role.name
        election_id = _uint128(msg.election_id) if msg.HasField("election_id") else None
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

    def _check_unique(self, stream: _Stream, role: str,
                      election_id: int | None) -> P4RuntimeError | None:
        if election_id is None:
            return None
        for other in self._streams.get(role, ()):
            if other is not stream and other.election_id == election_id:
                return P4RuntimeError(grpc.StatusCode.INVALID_ARGUMENT,
                                      f"election id {_election_text(election_id)} is already used "
                                      f"by another live controller for device {self.device_id}"
                                      f"{_role_text(role)}: pick a unique one")
        return None

    def _elect(self, stream: _Stream) -> None:
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

    def remove(self, stream: _Stream) -> None:
        """A stream closed: it releases its role; if it was primary, the others learn it."""
        with self._lock:
            streams = self._streams.get(stream.role, [])
            if stream not in streams:
                return
            streams.remove(stream)
            if self._primary.get(stream.role) is stream:
                del self._primary[stream.role]
                self._notify(stream.role, streams)

    def _notify(self, role: str, streams: Iterable[_Stream]) -> None:
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
                                      f"{_election_text(primary.election_id)}")
            else:
                msg.status.code = code_pb2.NOT_FOUND
                msg.status.message = ("no primary: send an election id >= "
                                      f"{_election_text(past)} to become primary")
            stream.send(p4r.StreamMessageResponse(arbitration=msg))

    def check_primary(self, role: str, election_id: int | None) -> None:
        """Raise PERMISSION_DENIED unless `election_id` is the primary's for `role`."""
        with self._lock:
            primary = self._primary.get(role)
            if primary is None:
                raise P4RuntimeError(
                    grpc.StatusCode.PERMISSION_DENIED,
                    f"no primary controller for device {self.device_id}{_role_text(role)}: open a "
                    "StreamChannel and send a MasterArbitrationUpdate with an election id >= "
                    f"{_election_text(self._highest.get(role, 0))} first")
            if election_id != primary.election_id:
                raise P4RuntimeError(
                    grpc.StatusCode.PERMISSION_DENIED,
                    f"election id {_election_text(election_id)} is not the primary's: the primary "
                    f"for device {self.device_id}{_role_text(role)} has election id "
                    f"{_election_text(primary.election_id)}; only the primary may write (send a "
                    "MasterArbitrationUpdate with a higher election id to take over)")

    def is_primary(self, stream: _Stream) -> bool:
        with self._lock:
            return self._primary.get(stream.role) is stream


# ------------------------------------------------------------ the servicer
_UPDATE_NAMES = {p4r.Update.INSERT: "INSERT", p4r.Update.MODIFY: "MODIFY",
                 p4r.Update.DELETE: "DELETE"}
_END = object()


class _Overlay:
    """The pipeline's tables and groups as a batch sees them: state plus the batch's updates."""

    def __init__(self, pipeline: Pipeline) -> None:
        self.pipeline = pipeline
        self.entries: dict[tuple[str, Any], Entry | None] = {}
        self.sizes: dict[str, int] = {}
        self.groups: dict[int, bool] = {}

    def entry(self, table: str, key: Any) -> Entry | None:
        if (table, key) in self.entries:
            return self.entries[(table, key)]
        return self.pipeline.tables[table].entries.get(key)

    def size(self, table: str) -> int:
        return self.sizes.get(table, len(self.pipeline.tables[table].entries))

    def set_entry(self, table: str, key: Any, entry: Entry | None) -> None:
        delta = (entry is not None) - (self.entry(table, key) is not None)
        self.sizes[table] = self.size(table) + delta
        self.entries[(table, key)] = entry

    def group_exists(self, group_id: int) -> bool:
        return self.groups.get(group_id, group_id in self.pipeline.groups)


class SoftswitchP4Runtime(p4runtime_pb2_grpc.P4RuntimeServicer):
    """P4Runtime for one `Pipeline` (one device)."""

    def __init__(self, pipeline: Pipeline, device_id: int = 1) -> None:
        self.pipeline = pipeline
        self.device_id = device_id
        self.arbiter = Arbiter(device_id)
        # Serializes writes, pipeline pushes and read snapshots (the data plane only reads
        # the tables, under pipeline.lock, which write_entry takes).
        self._lock = threading.Lock()
        self._config: p4r.ForwardingPipelineConfig | None = None
        self._schema: Schema | None = None
        self._saved = False  # a VERIFY_AND_SAVE awaits its COMMIT
        self._defaults = {name: (t.default_action, t.default_params)
                          for name, t in pipeline.tables.items()}
        # What the pipeline does not store but P4Runtime reads back.
        self._entry_meta: dict[tuple[str, Any], tuple[int, bytes]] = {}
        self._group_meta: dict[int, tuple[bytes, bool]] = {}  # metadata, replicas use `port`

    # ------------------------------------------------- pipeline config
    def load_p4info(self, p4info: p4info_pb2.P4Info, device_config: bytes = b"") -> None:
        """Install a pipeline config without a controller (the --p4info preload)."""
        schema = check_p4info(p4info, self.pipeline, self._defaults)
        config = p4r.ForwardingPipelineConfig(p4_device_config=device_config)
        config.p4info.CopyFrom(p4info)
        with self._lock:
            self._commit(config, schema, keep_state=False)

    def _commit(self, config: p4r.ForwardingPipelineConfig, schema: Schema,
                keep_state: bool) -> None:
        if not keep_state:
            self.pipeline.clear_tables()
            for name, (action, params) in self._defaults.items():
                self.pipeline.set_default_action(name, action, params)
            self._entry_meta.clear()
            self._group_meta.clear()
        self._config, self._schema, self._saved = config, schema, False

    def SetForwardingPipelineConfig(self, request: p4r.SetForwardingPipelineConfigRequest,
                                    context: grpc.ServicerContext) -> Any:
        return self._unary(context, self._set_pipeline, request)

    def _set_pipeline(self, request: p4r.SetForwardingPipelineConfigRequest) -> Any:
        action = request.action
        names = p4r.SetForwardingPipelineConfigRequest.Action
        self._check_device(request.device_id)
        self.arbiter.check_primary(request.role, self._election(request))
        if action == names.COMMIT:
            if request.HasField("config"):
                raise P4RuntimeError(grpc.StatusCode.INVALID_ARGUMENT,
                                     "COMMIT takes no config: it commits the one saved by "
                                     "VERIFY_AND_SAVE")
            with self._lock:
                if not self._saved:
                    raise P4RuntimeError(grpc.StatusCode.NOT_FOUND,
                                         "no saved config to commit: send VERIFY_AND_SAVE first")
                # The program never changes, and writes since the save went to the same
                # pipeline: committing keeps them (what the spec's replay would produce).
                self._saved = False
            return p4r.SetForwardingPipelineConfigResponse()
        if action not in (names.VERIFY, names.VERIFY_AND_SAVE, names.VERIFY_AND_COMMIT,
                          names.RECONCILE_AND_COMMIT):
            raise P4RuntimeError(grpc.StatusCode.INVALID_ARGUMENT,
                                 f"action {action} is not a SetForwardingPipelineConfig "
                                 "action: use VERIFY, VERIFY_AND_SAVE, VERIFY_AND_COMMIT, "
                                 "COMMIT or RECONCILE_AND_COMMIT")
        if not request.config.HasField("p4info"):
            raise P4RuntimeError(grpc.StatusCode.INVALID_ARGUMENT,
                                 "config.p4info is missing: send the P4Info of "
                                 "p4src/v1model/hysync.p4 (device_config may be empty)")
        try:
            schema = check_p4info(request.config.p4info, self.pipeline, self._defaults)
        except ConfigError as err:
            raise P4RuntimeError(grpc.StatusCode.INVALID_ARGUMENT,
                                 f"P4Info rejected: {err}") from err
        if action == names.VERIFY:
            return p4r.SetForwardingPipelineConfigResponse()
        config = p4r.ForwardingPipelineConfig()
        config.CopyFrom(request.config)  # device_config is kept for Get, otherwise unused
        with self._lock:
            if action == names.VERIFY_AND_SAVE:
                self._config, self._schema, self._saved = config, schema, True
            else:
                # Every accepted P4Info describes the same program and state is kept by
                # name, so RECONCILE_AND_COMMIT can always preserve it.
                self._commit(config, schema, keep_state=action == names.RECONCILE_AND_COMMIT)
        log.info("pipeline config %s (P4Info with %d tables)",
                 names.Name(action), len(schema.tables))
        return p4r.SetForwardingPipelineConfigResponse()

    def GetForwardingPipelineConfig(self, request: p4r.GetForwardingPipelineConfigRequest,
                                    context: grpc.ServicerContext) -> Any:
        return self._unary(context, self._get_pipeline, request)

    def _get_pipeline(self, request: p4r.GetForwardingPipelineConfigRequest) -> Any:
        self._check_device(request.device_id)
        response = p4r.GetForwardingPipelineConfigResponse()
        with self._lock:
            config = self._config
        if config is None:
            return response  # spec: config unset while none is installed
        kind = p4r.GetForwardingPipelineConfigRequest.ResponseType
        response.config.cookie.CopyFrom(config.cookie)
        if request.response_type in (kind.ALL, kind.P4INFO_AND_COOKIE):
            response.config.p4info.CopyFrom(config.p4info)
        if request.response_type in (kind.ALL, kind.DEVICE_CONFIG_AND_COOKIE):
            response.config.p4_device_config = config.p4_device_config
        return response

    def Capabilities(self, request: p4r.CapabilitiesRequest,
                     context: grpc.ServicerContext) -> p4r.CapabilitiesResponse:
        return p4r.CapabilitiesResponse(p4runtime_api_version=API_VERSION)

    # ---------------------------------------------------------- common
    def _unary(self, context: grpc.ServicerContext, handler: Callable[[Any], Any],
               request: Any) -> Any:
        """Run a unary handler; every failure becomes a status with a useful message."""
        failure: P4RuntimeError | _BatchError | None
        try:
            return handler(request)
        except (P4RuntimeError, _BatchError) as err:
            failure = err
        except Exception as err:  # a bug: report it instead of a bare UNKNOWN
            log.exception("internal error in %s", handler.__name__)
            failure = P4RuntimeError(grpc.StatusCode.INTERNAL,
                                     f"internal error in the softswitch ({err!r}); this is a "
                                     "bug, please report it with the request")
        if isinstance(failure, _BatchError):
            context.abort_with_status(_rich_status(failure.summary, failure.errors))
        context.abort(failure.code, failure.message)

    def _check_device(self, device_id: int) -> None:
        if device_id != self.device_id:
            raise P4RuntimeError(grpc.StatusCode.NOT_FOUND,
                                 f"unknown device id {device_id}: this softswitch is device "
                                 f"{self.device_id} (--device-id)")

    @staticmethod
    def _election(request: Any) -> int | None:
        return _uint128(request.election_id) if request.HasField("election_id") else None

    def _require_schema(self) -> Schema:
        if self._schema is None:
            raise P4RuntimeError(grpc.StatusCode.FAILED_PRECONDITION,
                                 "no pipeline config: push one with SetForwardingPipelineConfig")
        return self._schema

    # ----------------------------------------------------------- Write
    def Write(self, request: p4r.WriteRequest, context: grpc.ServicerContext) -> Any:
        return self._unary(context, self._write, request)

    def _write(self, request: p4r.WriteRequest) -> p4r.WriteResponse:
        self._check_device(request.device_id)
        with self._lock:
            # Checked under the write lock so that a write never lands after a primary change.
            self.arbiter.check_primary(request.role, self._election(request))
            schema = self._require_schema()
            if request.atomicity == p4r.WriteRequest.DATAPLANE_ATOMIC:
                raise P4RuntimeError(grpc.StatusCode.UNIMPLEMENTED,
                                     "DATAPLANE_ATOMIC is not supported: use CONTINUE_ON_ERROR or "
                                     "ROLLBACK_ON_ERROR (both are all-or-none here)")
            # Stronger than the spec's CONTINUE_ON_ERROR: the whole batch is validated
            # against the state it would meet before anything is applied, and one
            # invalid update rejects the batch with no state change (all-or-none).
            overlay = _Overlay(self.pipeline)
            ops: list[Callable[[], None]] = []
            errors: list[tuple[int, P4RuntimeError]] = []
            for i, update in enumerate(request.updates):
                try:
                    ops.append(self._plan(schema, overlay, update))
                except P4RuntimeError as err:
                    errors.append((i, err))
            if errors:
                raise self._batch_rejected(len(request.updates), errors)
            self._apply(ops)
        return p4r.WriteResponse()

    @staticmethod
    def _batch_rejected(n: int, errors: list[tuple[int, P4RuntimeError]]) -> _BatchError:
        # ABORTED without a message (the summary explains it): 39 bytes of trailer each.
        details = [_p4_error(grpc.StatusCode.ABORTED)] * n
        for i, err in errors:
            details[i] = _p4_error(err.code, err.message)
        first, err = errors[0]
        rest = [str(i) for i, _ in errors[1:11]] + (["..."] if len(errors) > 11 else [])
        others = f" (also invalid: updates {', '.join(rest)})" if rest else ""
        summary = (f"Write of {n} update(s) rejected, nothing applied (the server applies a "
                   f"batch all-or-none; updates marked ABORTED were valid): update {first}: "
                   f"{err.code.name}: {err.message}{others}")
        return _BatchError(summary, details)

    def _apply(self, ops: list[Callable[[], None]]) -> None:
        with self.pipeline.batch():
            self._apply_all(ops)

    def _apply_all(self, ops: list[Callable[[], None]]) -> None:
        for done, op in enumerate(ops):
            try:
                op()
            except EntryError as err:  # state changed behind the server's back
                code = getattr(grpc.StatusCode, err.code, grpc.StatusCode.INTERNAL)
                details = ([_p4_error(grpc.StatusCode.OK)] * done + [_p4_error(code, str(err))]
                           + [_p4_error(grpc.StatusCode.ABORTED, "not applied")]
                           * (len(ops) - done - 1))
                raise _BatchError(f"update {done} failed while applying ({code.name}: {err}); "
                                  f"the {done} update(s) before it were applied", details) from err

    def _plan(self, schema: Schema, overlay: _Overlay,
              update: p4r.Update) -> Callable[[], None]:
        """Validate one update against the overlay, record it there, return how to apply it."""
        if update.type not in _UPDATE_NAMES:
            raise P4RuntimeError(grpc.StatusCode.INVALID_ARGUMENT,
                                 "update type is UNSPECIFIED: set INSERT, MODIFY or DELETE")
        kind = update.entity.WhichOneof("entity")
        if kind == "table_entry":
            return self._plan_table(schema, overlay, update.type, update.entity.table_entry)
        if kind == "counter_entry":
            return self._plan_counter(schema, update.type, update.entity.counter_entry)
        if kind == "packet_replication_engine_entry":
            pre = update.entity.packet_replication_engine_entry
            if pre.WhichOneof("type") == "multicast_group_entry":
                return self._plan_group(overlay, update.type, pre.multicast_group_entry)
            raise P4RuntimeError(grpc.StatusCode.UNIMPLEMENTED,
                                 "clone sessions are not supported: the HySync program does not "
                                 "clone (multicast groups are)")
        raise _unsupported_entity(kind)

    # ------------------------------------------------ table entries
    def _plan_table(self, schema: Schema, overlay: _Overlay, utype: int,
                    te: p4r.TableEntry) -> Callable[[], None]:
        table = schema.table(te.table_id)
        if te.is_const:
            raise P4RuntimeError(grpc.StatusCode.INVALID_ARGUMENT,
                                 f"{table.name}: is_const must be false in a write")
        if te.is_default_action:
            return self._plan_default(schema, table, utype, te)
        if utype != p4r.Update.DELETE:
            _check_no_resources(table, te)
        match = self._decode_match(table, te.match)
        priority = self._check_priority(table, te.priority)
        key = (match, priority)
        existing = overlay.entry(table.name, key)
        where = f"{table.name}: {_describe_key(table, match, priority)}"
        if utype == p4r.Update.DELETE:
            if existing is None:
                raise P4RuntimeError(grpc.StatusCode.NOT_FOUND, f"{where}: no such entry to delete")
            overlay.set_entry(table.name, key, None)
            return lambda: self._apply_entry("DELETE", existing, (0, b""))
        if utype == p4r.Update.INSERT:
            if existing is not None:
                raise P4RuntimeError(grpc.StatusCode.ALREADY_EXISTS,
                                     f"{where}: an entry with this key exists; MODIFY it instead")
            if not te.HasField("action"):
                raise P4RuntimeError(grpc.StatusCode.INVALID_ARGUMENT,
                                     f"{where}: INSERT needs an action")
            if overlay.size(table.name) >= table.size:
                raise P4RuntimeError(grpc.StatusCode.RESOURCE_EXHAUSTED,
                                     f"{table.name} is full ({table.size} entries); delete some")
        elif existing is None:
            raise P4RuntimeError(grpc.StatusCode.NOT_FOUND,
                                 f"{where}: no such entry to modify; INSERT it first")
        if te.HasField("action"):
            action, params = self._decode_action(schema, table, te.action, default=False)
        else:  # MODIFY without an action keeps the entry's action (spec §9.1.2)
            assert existing is not None
            action, params = existing.action, existing.params
        entry = Entry(table.name, match, action, params, priority)
        overlay.set_entry(table.name, key, entry)
        name = _UPDATE_NAMES[utype]
        meta = (te.controller_metadata, te.metadata)
        return lambda: self._apply_entry(name, entry, meta)

    def _apply_entry(self, update: str, entry: Entry, meta: tuple[int, bytes]) -> None:
        self.pipeline.write_entry(update, entry)
        if update == "DELETE" or meta == (0, b""):
            self._entry_meta.pop((entry.table, entry.key), None)
        else:
            self._entry_meta[(entry.table, entry.key)] = meta

    def _plan_default(self, schema: Schema, table: TableInfo, utype: int,
                      te: p4r.TableEntry) -> Callable[[], None]:
        if utype != p4r.Update.MODIFY:
            raise P4RuntimeError(grpc.StatusCode.INVALID_ARGUMENT,
                                 f"{table.name}: the default entry always exists; MODIFY it "
                                 "(INSERT and DELETE are not allowed)")
        if te.match or te.priority:
            raise P4RuntimeError(grpc.StatusCode.INVALID_ARGUMENT,
                                 f"{table.name}: a default entry has no match and priority 0")
        if table.const_default:
            raise P4RuntimeError(grpc.StatusCode.PERMISSION_DENIED,
                                 f"{table.name}: the default action is const in the P4 program "
                                 f"({table.initial_default[0]}) and cannot be modified")
        _check_no_resources(table, te)
        if te.HasField("action"):
            action, params = self._decode_action(schema, table, te.action, default=True)
        else:  # spec §9.1.3: an unset action resets the default entry
            action, params = table.initial_default
        return lambda: self.pipeline.set_default_action(table.name, action, params)

    def _decode_match(self, table: TableInfo,
                      matches: Iterable[p4r.FieldMatch]) -> tuple[Any, ...]:
        values: list[Any] = [None] * len(table.fields)
        for fm in matches:
            pos = table.position.get(fm.field_id)
            if pos is None:
                known = ", ".join(f"{f.id} ({f.name})" for f in table.fields)
                raise P4RuntimeError(grpc.StatusCode.INVALID_ARGUMENT,
                                     f"{table.name} has no match field id {fm.field_id}; its "
                                     f"fields are {known}")
            f = table.fields[pos]
            what = f"{table.name} match field {f.name}"
            if values[pos] is not None:
                raise P4RuntimeError(grpc.StatusCode.INVALID_ARGUMENT, f"{what} given twice")
            kind = fm.WhichOneof("field_match_type")
            if kind != _KIND_NAME[f.kind]:
                raise P4RuntimeError(grpc.StatusCode.INVALID_ARGUMENT,
                                     f"{what} is a {_KIND_NAME[f.kind]} match, got {kind}")
            if f.kind == EXACT:
                values[pos] = decode_value(fm.exact.value, f.bits, what)
            else:
                lo = decode_value(fm.range.low, f.bits, f"{what} low")
                hi = decode_value(fm.range.high, f.bits, f"{what} high")
                if lo > hi:
                    raise P4RuntimeError(grpc.StatusCode.INVALID_ARGUMENT,
                                         f"{what}: low {lo} > high {hi}")
                if (lo, hi) == (0, (1 << f.bits) - 1):
                    raise P4RuntimeError(grpc.StatusCode.INVALID_ARGUMENT,
                                         f"{what}: the full range is a don't-care match; omit "
                                         "the field instead (spec §9.1.1)")
                values[pos] = (lo, hi)
        for pos, f in enumerate(table.fields):
            if values[pos] is None:
                if f.kind == EXACT:
                    raise P4RuntimeError(grpc.StatusCode.INVALID_ARGUMENT,
                                         f"{table.name}: exact match field {f.name} (id {f.id}) "
                                         "is missing; exact fields cannot be omitted")
                values[pos] = (0, (1 << f.bits) - 1)  # omitted range = don't care
        return tuple(values)

    @staticmethod
    def _check_priority(table: TableInfo, priority: int) -> int:
        if table.needs_priority and priority <= 0:
            raise P4RuntimeError(grpc.StatusCode.INVALID_ARGUMENT,
                                 f"{table.name} has a range match field: set a priority > 0 "
                                 "(higher wins)")
        if not table.needs_priority and priority != 0:
            raise P4RuntimeError(grpc.StatusCode.INVALID_ARGUMENT,
                                 f"{table.name} has only exact match fields: priority must be 0, "
                                 f"got {priority}")
        return priority

    def _decode_action(self, schema: Schema, table: TableInfo, ta: p4r.TableAction,
                       default: bool) -> tuple[str, tuple[int, ...]]:
        if ta.WhichOneof("type") != "action":
            raise P4RuntimeError(grpc.StatusCode.INVALID_ARGUMENT,
                                 f"{table.name} is a direct table: set action.action, not "
                                 f"{ta.WhichOneof('type')}")
        a = ta.action
        action = schema.actions.get(a.action_id)
        scope = table.scopes.get(a.action_id)
        if action is None or scope is None:
            known = ", ".join(f"{i} ({schema.actions[i].name})" for i in table.scopes)
            what = f"action {action.name}" if action else f"action id {a.action_id}"
            raise P4RuntimeError(grpc.StatusCode.INVALID_ARGUMENT,
                                 f"{what} is not an action of {table.name}; its actions are "
                                 f"{known}")
        if default and scope == TABLE_ONLY:
            raise P4RuntimeError(grpc.StatusCode.PERMISSION_DENIED,
                                 f"{action.name} is @tableonly in {table.name}: not a default")
        if not default and scope == DEFAULT_ONLY:
            raise P4RuntimeError(grpc.StatusCode.PERMISSION_DENIED,
                                 f"{action.name} is @defaultonly in {table.name}: entries need "
                                 "another action")
        values: list[int | None] = [None] * len(action.params)
        for p in a.params:
            pos = action.position.get(p.param_id)
            if pos is None:
                known = ", ".join(f"{q.id} ({q.name})" for q in action.params) or "none"
                raise P4RuntimeError(grpc.StatusCode.INVALID_ARGUMENT,
                                     f"action {action.name} has no param id {p.param_id}; its "
                                     f"params are {known}")
            param = action.params[pos]
            what = f"action {action.name} param {param.name}"
            if values[pos] is not None:
                raise P4RuntimeError(grpc.StatusCode.INVALID_ARGUMENT, f"{what} given twice")
            values[pos] = decode_value(p.value, param.bits, what)
        for pos, param in enumerate(action.params):
            if values[pos] is None:
                raise P4RuntimeError(grpc.StatusCode.INVALID_ARGUMENT,
                                     f"action {action.name} needs param {param.name} (id "
                                     f"{param.id}, {param.bits} bits)")
        return action.name, tuple(v for v in values if v is not None)

    # ----------------------------------------------- multicast groups
    def _plan_group(self, overlay: _Overlay, utype: int,
                    group: p4r.MulticastGroupEntry) -> Callable[[], None]:
        gid = group.multicast_group_id
        if not 0 < gid <= MAX_GROUP_ID:
            raise P4RuntimeError(grpc.StatusCode.INVALID_ARGUMENT,
                                 f"multicast_group_id {gid} is out of range: use 1..{MAX_GROUP_ID} "
                                 "(v1model mcast_grp is 16 bits; 0 means no multicast)")
        exists = overlay.group_exists(gid)
        name = _UPDATE_NAMES[utype]
        if utype == p4r.Update.DELETE:
            if not exists:
                raise P4RuntimeError(grpc.StatusCode.NOT_FOUND,
                                     f"multicast group {gid} does not exist: nothing to delete")
            overlay.groups[gid] = False
            return lambda: self._apply_group(name, gid, [], (b"", False))
        if utype == p4r.Update.INSERT and exists:
            raise P4RuntimeError(grpc.StatusCode.ALREADY_EXISTS,
                                 f"multicast group {gid} exists; MODIFY it instead")
        if utype == p4r.Update.MODIFY and not exists:
            raise P4RuntimeError(grpc.StatusCode.NOT_FOUND,
                                 f"multicast group {gid} does not exist; INSERT it first")
        replicas = []
        uses_port_bytes = False
        for i, r in enumerate(group.replicas):
            what = f"multicast group {gid} replica {i}"
            kind = r.WhichOneof("port_kind")
            if kind == "port":
                port = decode_value(r.port, PORT_BITS, f"{what} port")
                uses_port_bytes = True
            elif kind == "egress_port":
                port = r.egress_port
                if port >> PORT_BITS:
                    raise P4RuntimeError(grpc.StatusCode.INVALID_ARGUMENT,
                                         f"{what}: egress_port {port} does not fit v1model's "
                                         f"{PORT_BITS}-bit ports")
            else:
                raise P4RuntimeError(grpc.StatusCode.INVALID_ARGUMENT,
                                     f"{what} has no port: set egress_port (or port)")
            if r.instance > MAX_RID:
                raise P4RuntimeError(grpc.StatusCode.INVALID_ARGUMENT,
                                     f"{what}: instance {r.instance} does not fit v1model's "
                                     "16-bit egress_rid")
            replica = Replica(port, r.instance)
            if replica in replicas:
                raise P4RuntimeError(grpc.StatusCode.INVALID_ARGUMENT,
                                     f"{what}: (port {port}, instance {r.instance}) is listed "
                                     "twice; replicas must be unique")
            replicas.append(replica)
        overlay.groups[gid] = True
        meta = (group.metadata, uses_port_bytes)
        return lambda: self._apply_group(name, gid, replicas, meta)

    def _apply_group(self, update: str, gid: int, replicas: list[Replica],
                     meta: tuple[bytes, bool]) -> None:
        self.pipeline.write_group(update, gid, replicas)
        if update == "DELETE":
            self._group_meta.pop(gid, None)
        else:
            self._group_meta[gid] = meta

    # ------------------------------------------------------- counters
    def _plan_counter(self, schema: Schema, utype: int,
                      ce: p4r.CounterEntry) -> Callable[[], None]:
        if utype != p4r.Update.MODIFY:
            raise P4RuntimeError(grpc.StatusCode.INVALID_ARGUMENT,
                                 "counter entries always exist: MODIFY them (set one cell, or "
                                 "every cell when index is unset)")
        if ce.counter_id == 0:
            raise P4RuntimeError(grpc.StatusCode.INVALID_ARGUMENT,
                                 "counter_id 0 (every counter) is only valid in a Read: name one "
                                 "counter")
        info = schema.counter(ce.counter_id)
        index = _counter_index(info, ce)
        if not ce.HasField("data"):
            return lambda: None  # spec: the value is not modified when data is unset
        packets, nbytes = ce.data.packet_count, ce.data.byte_count
        if packets < 0 or nbytes < 0:
            raise P4RuntimeError(grpc.StatusCode.INVALID_ARGUMENT,
                                 f"{info.name}: counts must be >= 0")
        return lambda: self._apply_counter(info, index, packets, nbytes)

    def _apply_counter(self, info: CounterInfo, index: int | None, packets: int,
                       nbytes: int) -> None:
        counter = self.pipeline.counters[info.name]
        cells = slice(None) if index is None else slice(index, index + 1)
        n = info.size if index is None else 1
        with self.pipeline.lock:
            if info.unit != p4info_pb2.CounterSpec.BYTES:
                counter.packets[cells] = [packets] * n
            if info.unit != p4info_pb2.CounterSpec.PACKETS:
                counter.bytes[cells] = [nbytes] * n

    # ------------------------------------------------------------ Read
    def Read(self, request: p4r.ReadRequest,
             context: grpc.ServicerContext) -> Iterator[bytes]:
        failure: P4RuntimeError | _BatchError | None = None
        try:
            yield from self._read(request)
        except (P4RuntimeError, _BatchError) as err:
            failure = err
        except Exception as err:
            log.exception("internal error in Read")
            failure = P4RuntimeError(grpc.StatusCode.INTERNAL,
                                     f"internal error in the softswitch ({err!r}); this is a "
                                     "bug, please report it with the request")
        if isinstance(failure, _BatchError):
            context.abort_with_status(_rich_status(failure.summary, failure.errors))
        if failure is not None:
            context.abort(failure.code, failure.message)

    def _read(self, request: p4r.ReadRequest) -> Iterator[bytes]:
        """Serialized ReadResponses (see _encode_counters for why bytes, not messages)."""
        self._check_device(request.device_id)
        schema = self._require_schema()
        errors: list[p4r.Error] = []
        failed: list[str] = []
        batch: list[bytes] = []  # serialized ReadResponse.entities fields
        for i, entity in enumerate(request.entities):
            try:
                found = self._read_entity(schema, entity)
            except P4RuntimeError as err:
                errors.append(_p4_error(err.code, err.message))
                failed.append(f"entity {i}: {err.code.name}: {err.message}")
                continue
            errors.append(_p4_error(grpc.StatusCode.OK))
            for item in found:
                raw = item if isinstance(item, bytes) else item.SerializeToString()
                batch.append(_length_delimited(_TAG_RESPONSE_ENTITIES, raw))
                if len(batch) >= READ_CHUNK:
                    yield b"".join(batch)
                    batch = []
        if batch:
            yield b"".join(batch)
        if failed:
            more = f"; and {len(failed) - 3} more" if len(failed) > 3 else ""
            raise _BatchError(f"Read failed for {len(failed)} of {len(errors)} entities: "
                              + "; ".join(failed[:3]) + more, errors)

    def _read_entity(self, schema: Schema,
                     entity: p4r.Entity) -> Iterator[p4r.Entity] | Iterator[bytes]:
        """Validate one read request and snapshot what it selects; encode lazily."""
        kind = entity.WhichOneof("entity")
        if kind == "table_entry":
            return self._read_tables(schema, entity.table_entry)
        if kind == "counter_entry":
            return self._read_counters(schema, entity.counter_entry)
        if kind == "packet_replication_engine_entry":
            pre = entity.packet_replication_engine_entry
            if pre.WhichOneof("type") == "multicast_group_entry":
                return self._read_groups(pre.multicast_group_entry.multicast_group_id)
            raise P4RuntimeError(grpc.StatusCode.UNIMPLEMENTED,
                                 "clone sessions are not supported: the HySync program does not "
                                 "clone")
        raise _unsupported_entity(kind)

    def _read_tables(self, schema: Schema, te: p4r.TableEntry) -> Iterator[p4r.Entity]:
        if te.table_id == 0:
            if te.match or te.priority or te.HasField("action") or te.is_default_action:
                raise P4RuntimeError(grpc.StatusCode.INVALID_ARGUMENT,
                                     "table_id 0 reads every table and takes no other filter: "
                                     "set table_id to filter")
            tables = list(schema.tables.values())
        else:
            tables = [schema.table(te.table_id)]
        if te.is_default_action:
            table = tables[0]
            action, params = self.pipeline.tables[table.name].default_action, \
                self.pipeline.tables[table.name].default_params
            out = p4r.TableEntry(table_id=table.id, is_default_action=True)
            self._encode_action(schema, out, action, params)
            return iter([p4r.Entity(table_entry=out)])
        match = self._decode_match(tables[0], te.match) if te.match else None
        action_id = te.action.action.action_id if te.HasField("action") else 0
        snapshot = []
        with self._lock:
            for table in tables:
                for entry in self.pipeline.tables[table.name].entries.values():
                    meta = self._entry_meta.get((table.name, entry.key), (0, b""))
                    if ((match is None or entry.match == match)
                            and (not te.priority or entry.priority == te.priority)
                            and (not action_id
                                 or schema.action_ids.get(entry.action) == action_id)
                            and (not te.controller_metadata
                                 or meta[0] == te.controller_metadata)
                            and (not te.metadata or meta[1] == te.metadata)):
                        snapshot.append((table, entry, meta))
        return (p4r.Entity(table_entry=self._encode_entry(schema, *row)) for row in snapshot)

    def _encode_entry(self, schema: Schema, table: TableInfo, entry: Entry,
                      meta: tuple[int, bytes]) -> p4r.TableEntry:
        out = p4r.TableEntry(table_id=table.id, priority=entry.priority,
                             controller_metadata=meta[0], metadata=meta[1])
        for f, value in sorted(zip(table.fields, entry.match, strict=True), key=lambda x: x[0].id):
            if f.kind == EXACT:
                out.match.add(field_id=f.id).exact.value = encode_value(value)
            elif value != (0, (1 << f.bits) - 1):  # a don't-care range is omitted
                fm = out.match.add(field_id=f.id)
                fm.range.low, fm.range.high = encode_value(value[0]), encode_value(value[1])
        self._encode_action(schema, out, entry.action, entry.params)
        return out

    @staticmethod
    def _encode_action(schema: Schema, out: p4r.TableEntry, name: str,
                       params: tuple[int, ...]) -> None:
        action_id = schema.action_ids.get(name)
        if action_id is None or action_id not in schema.actions:
            raise P4RuntimeError(grpc.StatusCode.INTERNAL,
                                 f"{name} is not an action of the installed P4Info")
        action = schema.actions[action_id]
        a = out.action.action
        a.action_id = action_id
        for p, value in sorted(zip(action.params, params, strict=True), key=lambda x: x[0].id):
            a.params.add(param_id=p.id, value=encode_value(value))

    def _read_counters(self, schema: Schema, ce: p4r.CounterEntry) -> Iterator[bytes]:
        if ce.counter_id == 0:
            if ce.HasField("index"):
                raise P4RuntimeError(grpc.StatusCode.INVALID_ARGUMENT,
                                     "an index needs a counter_id: counter_id 0 reads every cell "
                                     "of every counter")
            infos = list(schema.counters.values())
        else:
            infos = [schema.counter(ce.counter_id)]
        snapshot = []
        for info in infos:
            index = _counter_index(info, ce)
            counter = self.pipeline.counters[info.name]
            with self.pipeline.lock:
                if index is None:
                    snapshot.append((info, 0, counter.packets[:], counter.bytes[:]))
                else:
                    snapshot.append((info, index, counter.packets[index:index + 1],
                                     counter.bytes[index:index + 1]))
        return _encode_counters(snapshot)

    def _read_groups(self, gid: int) -> Iterator[p4r.Entity]:
        with self._lock:
            groups = sorted(self.pipeline.groups.items()) if gid == 0 else \
                [(gid, self.pipeline.groups[gid])] if gid in self.pipeline.groups else []
            snapshot = [(g, list(replicas), self._group_meta.get(g, (b"", False)))
                        for g, replicas in groups]
        for g, replicas, (metadata, uses_port_bytes) in snapshot:
            out = p4r.MulticastGroupEntry(multicast_group_id=g, metadata=metadata)
            for r in replicas:
                replica = out.replicas.add(instance=r.rid)
                if uses_port_bytes:
                    replica.port = encode_value(r.port)
                else:
                    replica.egress_port = r.port
            entity = p4r.Entity()
            entity.packet_replication_engine_entry.multicast_group_entry.CopyFrom(out)
            yield entity

    # -------------------------------------------------- StreamChannel
    def StreamChannel(self, request_iterator: Iterator[p4r.StreamMessageRequest],
                      context: grpc.ServicerContext) -> Iterator[p4r.StreamMessageResponse]:
        out: queue.Queue[Any] = queue.Queue()
        stream = _Stream(out.put)
        context.add_callback(lambda: out.put(_END))
        threading.Thread(target=self._stream_reader, args=(stream, request_iterator, out),
                         name="p4rt-stream", daemon=True).start()
        try:
            while True:
                item = out.get()
                if item is _END:
                    return
                if isinstance(item, P4RuntimeError):
                    context.abort(item.code, item.message)
                yield item
        finally:
            self.arbiter.remove(stream)

    def _stream_reader(self, stream: _Stream, requests: Iterator[p4r.StreamMessageRequest],
                       out: queue.Queue[Any]) -> None:
        try:
            for request in requests:
                error = self._on_stream_message(stream, request)
                if error is not None:
                    out.put(error)  # the handler terminates the stream with it
                    return
        except Exception as err:  # the client went away mid-message
            log.debug("stream closed: %r", err)
        finally:
            self.arbiter.remove(stream)
            out.put(_END)

    def _on_stream_message(self, stream: _Stream,
                           request: p4r.StreamMessageRequest) -> P4RuntimeError | None:
        kind = request.WhichOneof("update")
        if kind == "arbitration":
            return self.arbiter.update(stream, request.arbitration)
        error = p4r.StreamError()
        if stream.device_id is None:
            error.canonical_code = grpc.StatusCode.FAILED_PRECONDITION.value[0]
            error.message = "send a MasterArbitrationUpdate first"
        elif kind == "packet" and not self.arbiter.is_primary(stream):
            error.canonical_code = grpc.StatusCode.PERMISSION_DENIED.value[0]
            error.message = "only the primary controller may send packets"
        else:
            error.canonical_code = grpc.StatusCode.UNIMPLEMENTED.value[0]
            error.message = (f"{kind} messages are not supported: the HySync program has no "
                             "packet I/O or digests")
        if kind == "packet":
            error.packet_out.packet_out.CopyFrom(request.packet)
        stream.send(p4r.StreamMessageResponse(error=error))
        return None


def _check_no_resources(table: TableInfo, te: p4r.TableEntry) -> None:
    for name in ("meter_config", "counter_data", "meter_counter_data"):
        if te.HasField(name):
            raise P4RuntimeError(grpc.StatusCode.INVALID_ARGUMENT,
                                 f"{table.name} has no direct meter or counter: leave {name} unset")
    if te.idle_timeout_ns:
        raise P4RuntimeError(grpc.StatusCode.INVALID_ARGUMENT,
                             f"{table.name} does not support idle timeout: leave idle_timeout_ns 0")


def _counter_index(info: CounterInfo, ce: p4r.CounterEntry) -> int | None:
    if not ce.HasField("index"):
        return None
    index = ce.index.index
    if index < 0:
        raise P4RuntimeError(grpc.StatusCode.INVALID_ARGUMENT,
                             f"{info.name}: index {index} is negative")
    if index >= info.size:
        raise P4RuntimeError(grpc.StatusCode.OUT_OF_RANGE,
                             f"{info.name}: index {index} is out of range (0..{info.size - 1})")
    return index


# Counter reads are encoded by hand: the straggler policy reads 8192-cell counters
# periodically, and building one p4.v1.Entity per cell with the pure-Python protobuf
# this project pins (3.20) costs ~100 us each, seconds per read, holding the GIL the
# data plane needs. The wire format of Entity{counter_entry} is small and fixed
# (field numbers from p4/v1/p4runtime.proto; a test parses the result with protobuf).
_TAG_RESPONSE_ENTITIES = b"\x0a"  # ReadResponse.entities = 1
_TAG_COUNTER_ENTRY = b"\x3a"  # Entity.counter_entry = 7
_TAG_COUNTER_ID = b"\x08"  # CounterEntry.counter_id = 1
_TAG_INDEX = b"\x12"  # CounterEntry.index = 2 (Index.index = 1)
_TAG_DATA = b"\x1a"  # CounterEntry.data = 3 (CounterData.byte_count = 1, packet_count = 2)
_EMPTY_DATA = _TAG_DATA + b"\x00"


def _varint(value: int) -> bytes:
    out = bytearray()
    while value > 0x7F:
        out.append(value & 0x7F | 0x80)
        value >>= 7
    out.append(value)
    return bytes(out)


def _length_delimited(tag: bytes, payload: bytes) -> bytes:
    return tag + _varint(len(payload)) + payload


@functools.cache
def _index_field(index: int) -> bytes:
    return _length_delimited(_TAG_INDEX, b"\x08" + _varint(index) if index else b"")


def _data_field(packets: int, nbytes: int, unit: int) -> bytes:
    body = b""
    if nbytes and unit != p4info_pb2.CounterSpec.PACKETS:
        body += b"\x08" + _varint(nbytes)
    if packets and unit != p4info_pb2.CounterSpec.BYTES:
        body += b"\x10" + _varint(packets)
    return _length_delimited(_TAG_DATA, body) if body else _EMPTY_DATA


def _encode_counters(snapshot: list[tuple[CounterInfo, int, list[int], list[int]]]
                     ) -> Iterator[bytes]:
    """Serialized Entity{counter_entry{counter_id, index, data}}, one per cell."""
    for info, first, packets, nbytes in snapshot:
        head = _TAG_COUNTER_ID + _varint(info.id)
        for i, (p, b) in enumerate(zip(packets, nbytes, strict=True)):
            entry = head + _index_field(first + i) + _data_field(p, b, info.unit)
            yield _length_delimited(_TAG_COUNTER_ENTRY, entry)


def _describe_key(table: TableInfo, match: tuple[Any, ...], priority: int) -> str:
    parts = []
    for f, value in zip(table.fields, match, strict=True):
        parts.append(f"{f.name}={value[0]}..{value[1]}" if f.kind == RANGE else f"{f.name}={value}")
    if priority:
        parts.append(f"priority {priority}")
    return ", ".join(parts)


def _unsupported_entity(kind: str | None) -> P4RuntimeError:
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


def _handlers(servicer: SoftswitchP4Runtime) -> grpc.GenericRpcHandler:
    """p4runtime_pb2_grpc.add_P4RuntimeServicer_to_server, except that Read yields bytes."""
    def handler(kind: Callable[..., grpc.RpcMethodHandler], method: Callable[..., Any],
                request: Any, response: Any) -> grpc.RpcMethodHandler:
        serialize = response.SerializeToString if response is not bytes else bytes
        return kind(method, request_deserializer=request.FromString,
                    response_serializer=serialize)

    return grpc.method_handlers_generic_handler("p4.v1.P4Runtime", {
        "Write": handler(grpc.unary_unary_rpc_method_handler, servicer.Write,
                         p4r.WriteRequest, p4r.WriteResponse),
        "Read": handler(grpc.unary_stream_rpc_method_handler, servicer.Read,
                        p4r.ReadRequest, bytes),
        "SetForwardingPipelineConfig": handler(
            grpc.unary_unary_rpc_method_handler, servicer.SetForwardingPipelineConfig,
            p4r.SetForwardingPipelineConfigRequest, p4r.SetForwardingPipelineConfigResponse),
        "GetForwardingPipelineConfig": handler(
            grpc.unary_unary_rpc_method_handler, servicer.GetForwardingPipelineConfig,
            p4r.GetForwardingPipelineConfigRequest, p4r.GetForwardingPipelineConfigResponse),
        "StreamChannel": handler(grpc.stream_stream_rpc_method_handler, servicer.StreamChannel,
                                 p4r.StreamMessageRequest, p4r.StreamMessageResponse),
        "Capabilities": handler(grpc.unary_unary_rpc_method_handler, servicer.Capabilities,
                                p4r.CapabilitiesRequest, p4r.CapabilitiesResponse),
    })


def serve(pipeline: Pipeline, grpc_addr: str, device_id: int = 1, *,
          p4info: p4info_pb2.P4Info | None = None,
          max_workers: int = 32) -> tuple[grpc.Server, int]:
    """Start a P4Runtime server for `pipeline` on `grpc_addr` (port 0 picks a free port).

    Returns the running server and the port it is bound to. `p4info` preloads a
    pipeline config (raises ConfigError if it does not fit). Raises OSError if the
    address cannot be bound.
    """
    servicer = SoftswitchP4Runtime(pipeline, device_id)
    if p4info is not None:
        servicer.load_p4info(p4info)
    server = grpc.server(
        futures.ThreadPoolExecutor(max_workers=max_workers, thread_name_prefix="p4rt"),
        options=[("grpc.so_reuseport", 0),  # a second softswitch on the port must fail
                 ("grpc.max_receive_message_length", _MAX_MESSAGE),
                 ("grpc.max_send_message_length", _MAX_MESSAGE)])
    server.add_generic_rpc_handlers((_handlers(servicer),))
    try:
        port = server.add_insecure_port(grpc_addr)
    except RuntimeError as err:
        port = 0
        reason = str(err).split(";")[0]
    else:
        reason = "bind failed"
    if port == 0:
        server.stop(None)
        raise OSError(f"cannot listen for P4Runtime on {grpc_addr} ({reason}): is the port in "
                      "use or the address wrong? Pick another with --grpc-addr HOST:PORT")
    server.start()
    log.info("P4Runtime server for device %d on port %d", device_id, port)
    return server, port
