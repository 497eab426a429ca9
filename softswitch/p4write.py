"""Write for the softswitch's server: a batch validated whole, then applied whole.

Stronger than the spec's CONTINUE_ON_ERROR: each update is planned against the state
it would meet (the pipeline plus the batch's earlier updates, an `Overlay`), and one
invalid update rejects the batch with no state change (all-or-none). The overlay is a
copy of the touched tables, changed as planned: a valid batch is swapped into the
pipeline whole (Pipeline.replace), so the data plane never waits while a batch is
decoded and planned, and sees all of it or none of it.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from typing import Any

import grpc
from p4.config.v1 import p4info_pb2
from p4.v1 import p4runtime_pb2 as p4r

from hysync import p4names, p4rt_codec
from hysync.softswitch.levels import role_of_params
from hysync.softswitch.p4binding import BoundCounter, BoundTable, PipelineBinding
from hysync.softswitch.p4status import BatchError, P4RuntimeError, p4_error, unsupported_entity
from hysync.softswitch.p4values import (
    DecodeCache,
    check_priority,
    counter_index,
    decode_action,
    decode_match,
    decode_value,
    describe_key,
)
from hysync.softswitch.pipeline import Pipeline
from hysync.softswitch.tables import Entry, Replica

# v1model standard metadata widths: mcast_grp bit<16>, egress_spec bit<9>, egress_rid bit<16>.
MAX_GROUP_ID = 0xFFFF
PORT_BITS = 9
MAX_RID = 0xFFFF
INSERT, MODIFY, DELETE = p4r.Update.INSERT, p4r.Update.MODIFY, p4r.Update.DELETE
UPDATE_TYPES = (INSERT, MODIFY, DELETE)


@dataclass(slots=True)
class Annotations:
    """What the pipeline does not store but P4Runtime reads back."""

    entries: dict[tuple[str, Any], tuple[int, bytes]] = field(default_factory=dict)
    groups: dict[int, tuple[bytes, bool]] = field(default_factory=dict)  # metadata, uses `port`

    def clear(self) -> None:
        self.entries.clear()
        self.groups.clear()


class Overlay:
    """The pipeline's state as a batch sees it, built beside the pipeline: each table and
    the groups are copied when the batch first touches them and changed in the copy. The
    pipeline swaps the copies in when the batch is valid (Pipeline.replace): packets never
    wait while a batch is planned, and see all of it or none."""

    def __init__(self, pipeline: Pipeline) -> None:
        self.pipeline = pipeline
        self.tables: dict[str, dict[Any, Entry]] = {}
        self.groups: dict[int, list[Replica]] | None = None
        self.defaults: dict[str, tuple[str, tuple[int, ...]]] = {}
        self.entry_meta: list[tuple[str, Any, tuple[int, bytes] | None]] = []
        self.group_meta: list[tuple[int, tuple[bytes, bool] | None]] = []
        self.counters: list[Callable[[], None]] = []
        self.decoded: DecodeCache = {}

    def table(self, name: str) -> dict[Any, Entry]:
        entries = self.tables.get(name)
        if entries is None:
            entries = self.tables[name] = dict(self.pipeline.tables[name].entries)
        return entries

    def group_table(self) -> dict[int, list[Replica]]:
        if self.groups is None:
            self.groups = dict(self.pipeline.groups)
        return self.groups


class Writer:
    """Plans and applies the updates of Write requests to one pipeline."""

    def __init__(self, pipeline: Pipeline, annotations: Annotations) -> None:
        self.pipeline = pipeline
        self.annotations = annotations

    def write(self, binding: PipelineBinding, updates: Sequence[p4rt_codec.Update]) -> None:
        """Apply every update or, raising BatchError, none."""
        overlay = Overlay(self.pipeline)
        errors: list[tuple[int, P4RuntimeError]] = []
        for i, update in enumerate(updates):
            try:
                self._plan(binding, overlay, update)
            except P4RuntimeError as err:
                errors.append((i, err))
        if errors:
            raise _batch_rejected(len(updates), errors)
        self.pipeline.replace(overlay.tables, overlay.groups, overlay.defaults)
        for table, key, meta in overlay.entry_meta:
            if meta is None:
                self.annotations.entries.pop((table, key), None)
            else:
                self.annotations.entries[(table, key)] = meta
        for gid, group_meta in overlay.group_meta:
            if group_meta is None:
                self.annotations.groups.pop(gid, None)
            else:
                self.annotations.groups[gid] = group_meta
        for write_counter in overlay.counters:
            write_counter()

    def _plan(self, binding: PipelineBinding, overlay: Overlay, update: p4rt_codec.Update) -> None:
        """Validate one update against the overlay and record it there."""
        utype = update.type
        if utype not in UPDATE_TYPES:
            what = "UNSPECIFIED" if utype == 0 else f"{utype}, which P4Runtime does not define"
            raise P4RuntimeError(grpc.StatusCode.INVALID_ARGUMENT,
                                 f"update type is {what}: set INSERT, MODIFY or DELETE")
        entity = update.entity
        if isinstance(entity, p4rt_codec.TableEntry):
            self._plan_table(binding, overlay, utype, entity)
        elif isinstance(entity, p4rt_codec.CounterEntry):
            self._plan_counter(binding, overlay, utype, entity)
        elif isinstance(entity, p4rt_codec.MulticastGroupEntry):
            self._plan_group(overlay, utype, entity)
        elif entity.kind in ("clone_session_entry", "packet_replication_engine_entry"):
            raise P4RuntimeError(grpc.StatusCode.UNIMPLEMENTED,
                                 "clone sessions are not supported: the HySync program does not "
                                 "clone (multicast groups are)")
        else:
            raise unsupported_entity(entity.kind)

    # ------------------------------------------------ table entries
    def _plan_table(self, binding: PipelineBinding, overlay: Overlay, utype: int,
                    te: p4rt_codec.TableEntry) -> None:
        table = binding.table(te.table_id)
        if te.is_const:
            raise P4RuntimeError(grpc.StatusCode.INVALID_ARGUMENT,
                                 f"{table.name}: is_const must be false in a write")
        if te.is_default_action:
            self._plan_default(binding, overlay, table, utype, te)
            return
        if utype != DELETE:
            _check_no_resources(table, te)
        match = decode_match(table, te.match, overlay.decoded)
        priority = check_priority(table, te.priority)
        key = (match, priority)
        entries = overlay.table(table.name)
        existing = entries.get(key)
        if utype == DELETE:
            if existing is None:
                raise P4RuntimeError(grpc.StatusCode.NOT_FOUND,
                                     f"{_where(table, match, priority)}: no such entry to delete")
            del entries[key]
            overlay.entry_meta.append((table.name, key, None))
            return
        if utype == INSERT:
            if existing is not None:
                raise P4RuntimeError(grpc.StatusCode.ALREADY_EXISTS,
                                     f"{_where(table, match, priority)}: an entry with this key "
                                     "exists; MODIFY it instead")
            if te.action is None:
                raise P4RuntimeError(grpc.StatusCode.INVALID_ARGUMENT,
                                     f"{_where(table, match, priority)}: INSERT needs an action")
            if len(entries) >= table.size:
                raise P4RuntimeError(grpc.StatusCode.RESOURCE_EXHAUSTED,
                                     f"{table.name} is full ({table.size} entries); delete some")
        elif existing is None:
            raise P4RuntimeError(grpc.StatusCode.NOT_FOUND,
                                 f"{_where(table, match, priority)}: no such entry to modify; "
                                 "INSERT it first")
        if te.action is not None:
            action, params = decode_action(binding, table, te.action, False, overlay.decoded)
        else:  # MODIFY without an action keeps the entry's action (spec §9.1.2)
            assert existing is not None
            action, params = existing.action, existing.params
        if table.name == p4names.ADMISSION_ROLES and action == p4names.ADMISSION_SET_ROLE:
            try:
                role_of_params(params)
            except ValueError as err:
                raise P4RuntimeError(grpc.StatusCode.INVALID_ARGUMENT,
                                     f"{_where(table, match, priority)}: {err}") from None
        entries[key] = Entry(table.name, match, action, params, priority)
        meta = (te.controller_metadata, te.metadata)
        overlay.entry_meta.append((table.name, key, None if meta == (0, b"") else meta))

    def _plan_default(self, binding: PipelineBinding, overlay: Overlay, table: BoundTable,
                      utype: int, te: p4rt_codec.TableEntry) -> None:
        if utype != MODIFY:
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
        if te.action is not None:
            overlay.defaults[table.name] = decode_action(binding, table, te.action, default=True)
        else:  # spec §9.1.3: an unset action resets the default entry
            overlay.defaults[table.name] = table.initial_default

    # ----------------------------------------------- multicast groups
    def _plan_group(self, overlay: Overlay, utype: int,
                    group: p4rt_codec.MulticastGroupEntry) -> None:
        gid = group.multicast_group_id
        if not 0 < gid <= MAX_GROUP_ID:
            raise P4RuntimeError(grpc.StatusCode.INVALID_ARGUMENT,
                                 f"multicast_group_id {gid} is out of range: use 1..{MAX_GROUP_ID} "
                                 "(v1model mcast_grp is 16 bits; 0 means no multicast)")
        groups = overlay.group_table()
        exists = gid in groups
        if utype == DELETE:
            if not exists:
                raise P4RuntimeError(grpc.StatusCode.NOT_FOUND,
                                     f"multicast group {gid} does not exist: nothing to delete")
            del groups[gid]
            overlay.group_meta.append((gid, None))
            return
        if utype == INSERT and exists:
            raise P4RuntimeError(grpc.StatusCode.ALREADY_EXISTS,
                                 f"multicast group {gid} exists; MODIFY it instead")
        if utype == MODIFY and not exists:
            raise P4RuntimeError(grpc.StatusCode.NOT_FOUND,
                                 f"multicast group {gid} does not exist; INSERT it first")
        replicas: list[Replica] = []
        uses_port_bytes = False
        for i, r in enumerate(group.replicas):
            what = f"multicast group {gid} replica {i}"
            if r.port is not None:
                port = decode_value(r.port, PORT_BITS, f"{what} port")
                uses_port_bytes = True
            elif r.egress_port is not None:
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
        groups[gid] = replicas
        overlay.group_meta.append((gid, (group.metadata, uses_port_bytes)))

    # ------------------------------------------------------- counters
    def _plan_counter(self, binding: PipelineBinding, overlay: Overlay, utype: int,
                      ce: p4rt_codec.CounterEntry) -> None:
        if utype != MODIFY:
            raise P4RuntimeError(grpc.StatusCode.INVALID_ARGUMENT,
                                 "counter entries always exist: MODIFY them (set one cell, or "
                                 "every cell when index is unset)")
        if ce.counter_id == 0:
            raise P4RuntimeError(grpc.StatusCode.INVALID_ARGUMENT,
                                 "counter_id 0 (every counter) is only valid in a Read: name one "
                                 "counter")
        info = binding.counter(ce.counter_id)
        index = counter_index(info, ce.index)
        if ce.data is None:
            return  # spec: the value is not modified when data is unset
        packets, nbytes = ce.data.packet_count, ce.data.byte_count
        if packets < 0 or nbytes < 0:
            raise P4RuntimeError(grpc.StatusCode.INVALID_ARGUMENT,
                                 f"{info.name}: counts must be >= 0")
        overlay.counters.append(lambda: self._apply_counter(info, index, packets, nbytes))

    def _apply_counter(self, info: BoundCounter, index: int | None, packets: int,
                       nbytes: int) -> None:
        counter = self.pipeline.counters[info.name]
        cells = slice(None) if index is None else slice(index, index + 1)
        n = info.size if index is None else 1
        with self.pipeline.lock:
            if info.unit != p4info_pb2.CounterSpec.BYTES:
                counter.packets[cells] = [packets] * n
            if info.unit != p4info_pb2.CounterSpec.PACKETS:
                counter.bytes[cells] = [nbytes] * n


def _where(table: BoundTable, match: tuple[Any, ...], priority: int) -> str:
    return f"{table.name}: {describe_key(table, match, priority)}"


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


def _check_no_resources(table: BoundTable, te: p4rt_codec.TableEntry) -> None:
    for name in ("meter_config", "counter_data", "meter_counter_data"):
        if name in te.resources:
            raise P4RuntimeError(grpc.StatusCode.INVALID_ARGUMENT,
                                 f"{table.name} has no direct meter or counter: leave {name} unset")
    if te.idle_timeout_ns:
        raise P4RuntimeError(grpc.StatusCode.INVALID_ARGUMENT,
                             f"{table.name} does not support idle timeout: leave idle_timeout_ns 0")
