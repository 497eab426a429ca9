"""Write for the softswitch's server: a batch validated whole, then applied whole.

Stronger than the spec's CONTINUE_ON_ERROR: each update is planned against the state
it would meet (the pipeline plus the batch's earlier updates, an `Overlay`), and one
invalid update rejects the batch with no state change (all-or-none). Planning returns
how to apply the update; applying runs under the pipeline's lock as one batch.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any

import grpc
from p4.config.v1 import p4info_pb2
from p4.v1 import p4runtime_pb2 as p4r

from softswitch.p4schema_check import CounterInfo, Schema, TableInfo
from softswitch.p4status import BatchError, P4RuntimeError, p4_error, unsupported_entity
from softswitch.p4values import (
    check_priority,
    counter_index,
    decode_action,
    decode_match,
    decode_value,
    describe_key,
)
from softswitch.pipeline import Pipeline
from softswitch.tables import Entry, EntryError, Replica

# v1model standard metadata widths: mcast_grp bit<16>, egress_spec bit<9>, egress_rid bit<16>.
MAX_GROUP_ID = 0xFFFF
PORT_BITS = 9
MAX_RID = 0xFFFF
UPDATE_NAMES = {p4r.Update.INSERT: "INSERT", p4r.Update.MODIFY: "MODIFY",
                p4r.Update.DELETE: "DELETE"}


@dataclass(slots=True)
class Annotations:
    """What the pipeline does not store but P4Runtime reads back."""

    entries: dict[tuple[str, Any], tuple[int, bytes]] = field(default_factory=dict)
    groups: dict[int, tuple[bytes, bool]] = field(default_factory=dict)  # metadata, uses `port`

    def clear(self) -> None:
        self.entries.clear()
        self.groups.clear()


class Overlay:
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


class Writer:
    """Plans and applies the updates of Write requests to one pipeline."""

    def __init__(self, pipeline: Pipeline, annotations: Annotations) -> None:
        self.pipeline = pipeline
        self.annotations = annotations

    def write(self, schema: Schema, updates: list[p4r.Update]) -> None:
        """Apply every update or, raising BatchError, none."""
        overlay = Overlay(self.pipeline)
        ops: list[Callable[[], None]] = []
        errors: list[tuple[int, P4RuntimeError]] = []
        for i, update in enumerate(updates):
            try:
                ops.append(self._plan(schema, overlay, update))
            except P4RuntimeError as err:
                errors.append((i, err))
        if errors:
            raise _batch_rejected(len(updates), errors)
        with self.pipeline.batch():
            self._apply_all(ops)

    def _apply_all(self, ops: list[Callable[[], None]]) -> None:
        for done, op in enumerate(ops):
            try:
                op()
            except EntryError as err:  # state changed behind the server's back
                code = getattr(grpc.StatusCode, err.code, grpc.StatusCode.INTERNAL)
                details = ([p4_error(grpc.StatusCode.OK)] * done + [p4_error(code, str(err))]
                           + [p4_error(grpc.StatusCode.ABORTED, "not applied")]
                           * (len(ops) - done - 1))
                raise BatchError(f"update {done} failed while applying ({code.name}: {err}); "
                                 f"the {done} update(s) before it were applied", details) from err

    def _plan(self, schema: Schema, overlay: Overlay,
              update: p4r.Update) -> Callable[[], None]:
        """Validate one update against the overlay, record it there, return how to apply it."""
        if update.type not in UPDATE_NAMES:
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
        raise unsupported_entity(kind)

    # ------------------------------------------------ table entries
    def _plan_table(self, schema: Schema, overlay: Overlay, utype: int,
                    te: p4r.TableEntry) -> Callable[[], None]:
        table = schema.table(te.table_id)
        if te.is_const:
            raise P4RuntimeError(grpc.StatusCode.INVALID_ARGUMENT,
                                 f"{table.name}: is_const must be false in a write")
        if te.is_default_action:
            return self._plan_default(schema, table, utype, te)
        if utype != p4r.Update.DELETE:
            _check_no_resources(table, te)
        match = decode_match(table, te.match)
        priority = check_priority(table, te.priority)
        key = (match, priority)
        existing = overlay.entry(table.name, key)
        where = f"{table.name}: {describe_key(table, match, priority)}"
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
            action, params = decode_action(schema, table, te.action, default=False)
        else:  # MODIFY without an action keeps the entry's action (spec §9.1.2)
            assert existing is not None
            action, params = existing.action, existing.params
        entry = Entry(table.name, match, action, params, priority)
        overlay.set_entry(table.name, key, entry)
        name = UPDATE_NAMES[utype]
        meta = (te.controller_metadata, te.metadata)
        return lambda: self._apply_entry(name, entry, meta)

    def _apply_entry(self, update: str, entry: Entry, meta: tuple[int, bytes]) -> None:
        self.pipeline.write_entry(update, entry)
        if update == "DELETE" or meta == (0, b""):
            self.annotations.entries.pop((entry.table, entry.key), None)
        else:
            self.annotations.entries[(entry.table, entry.key)] = meta

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
            action, params = decode_action(schema, table, te.action, default=True)
        else:  # spec §9.1.3: an unset action resets the default entry
            action, params = table.initial_default
        return lambda: self.pipeline.set_default_action(table.name, action, params)

    # ----------------------------------------------- multicast groups
    def _plan_group(self, overlay: Overlay, utype: int,
                    group: p4r.MulticastGroupEntry) -> Callable[[], None]:
        gid = group.multicast_group_id
        if not 0 < gid <= MAX_GROUP_ID:
            raise P4RuntimeError(grpc.StatusCode.INVALID_ARGUMENT,
                                 f"multicast_group_id {gid} is out of range: use 1..{MAX_GROUP_ID} "
                                 "(v1model mcast_grp is 16 bits; 0 means no multicast)")
        exists = overlay.group_exists(gid)
        name = UPDATE_NAMES[utype]
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
            self.annotations.groups.pop(gid, None)
        else:
            self.annotations.groups[gid] = meta

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
        index = counter_index(info, ce)
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


def _batch_rejected(n: int, errors: list[tuple[int, P4RuntimeError]]) -> BatchError:
    # ABORTED without a message (the summary explains it): 39 bytes of trailer each.
    details = [p4_error(grpc.StatusCode.ABORTED)] * n
    for i, err in errors:
        details[i] = p4_error(err.code, err.message)
    first, err = errors[0]
    rest = [str(i) for i, _ in errors[1:11]] + (["..."] if len(errors) > 11 else [])
    others = f" (also invalid: updates {', '.join(rest)})" if rest else ""
    summary = (f"Write of {n} update(s) rejected, nothing applied (the server applies a "
               f"batch all-or-none; updates marked ABORTED were valid): update {first}: "
               f"{err.code.name}: {err.message}{others}")
    return BatchError(summary, details)


def _check_no_resources(table: TableInfo, te: p4r.TableEntry) -> None:
    for name in ("meter_config", "counter_data", "meter_counter_data"):
        if te.HasField(name):
            raise P4RuntimeError(grpc.StatusCode.INVALID_ARGUMENT,
                                 f"{table.name} has no direct meter or counter: leave {name} unset")
    if te.idle_timeout_ns:
        raise P4RuntimeError(grpc.StatusCode.INVALID_ARGUMENT,
                             f"{table.name} does not support idle timeout: leave idle_timeout_ns 0")
