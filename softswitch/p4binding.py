"""A pushed P4Info bound to the softswitch pipeline: checked, then its ids mapped to positions.

The P4Info must describe p4src/v1model/hysync.p4 (docs/protocol.md §8; the program's
structure is hysync/p4names.py, generated from the committed P4Info): a P4Info of
another program is refused with a `ConfigError` naming the first mismatch instead of
being silently half-served. What passes becomes a `PipelineBinding`: the P4Info's ids
bound to the positions of the pipeline's Entry.match and Entry.params, which the server's
reads and writes index by. Name lookups with close-name hints, and the value codec, are
hysync.p4schema's (the P4Info as the controller sees it); a binding is what the switch
serves, so a P4Info that passes here also loads there.
"""

from __future__ import annotations

from dataclasses import dataclass, field

import grpc
from p4.config.v1 import p4info_pb2

from hysync import p4names
from hysync.p4schema import MatchFieldInfo, ParamInfo
from hysync.softswitch.p4status import P4RuntimeError
from hysync.softswitch.pipeline import Pipeline
from hysync.wire import Mode

EXACT = "exact"
RANGE = "range"
_KINDS = {p4info_pb2.MatchField.EXACT: EXACT, p4info_pb2.MatchField.RANGE: RANGE}
MODE_ENUM = "sync_mode_t"  # the modes table's `mode` parameter (p4src/shared/wire.p4)
TABLE_ONLY = p4info_pb2.ActionRef.TABLE_ONLY
DEFAULT_ONLY = p4info_pb2.ActionRef.DEFAULT_ONLY
# The program is p4names' TABLE_KEYS, TABLE_ACTIONS and ACTION_PARAMS: key fields and
# params in the order the pipeline's Entry.match and Entry.params hold them. P4Info ids
# are mapped onto these positions by name, so a P4Info that orders them differently
# still works. A table's first action is required, the rest allowed.
# Tables a program may leave out (a job at two levels, docs/protocol.md §11): a P4Info
# without them (the Tofino 1 program's) binds, and its switch runs every job at one level.
TWO_LEVEL_TABLES = frozenset({p4names.ADMISSION_ROLES})


class ConfigError(ValueError):
    """A P4Info that does not describe the program the softswitch pipeline implements."""


@dataclass(frozen=True, slots=True)
class BoundAction:
    id: int
    name: str
    params: tuple[ParamInfo, ...]  # in Entry.params order
    position: dict[int, int]  # param id -> index in params


@dataclass(frozen=True, slots=True)
class BoundTable:
    id: int
    name: str
    fields: tuple[MatchFieldInfo, ...]  # in Entry.match order
    position: dict[int, int]  # field id -> index in fields
    scopes: dict[int, int]  # action id -> ActionRef scope
    const_default: bool
    initial_default: tuple[str, tuple[int, ...]]
    size: int
    needs_priority: bool  # it has a range field


@dataclass(frozen=True, slots=True)
class BoundCounter:
    id: int
    name: str
    size: int
    unit: int


@dataclass(slots=True)
class PipelineBinding:
    """The P4Info, indexed both ways: ids for requests, names for reads."""

    tables: dict[int, BoundTable] = field(default_factory=dict)
    actions: dict[int, BoundAction] = field(default_factory=dict)
    counters: dict[int, BoundCounter] = field(default_factory=dict)
    table_ids: dict[str, int] = field(default_factory=dict)
    action_ids: dict[str, int] = field(default_factory=dict)

    def table(self, table_id: int) -> BoundTable:
        table = self.tables.get(table_id)
        if table is None:
            known = ", ".join(f"{t.id} ({t.name})" for t in self.tables.values())
            raise P4RuntimeError(grpc.StatusCode.INVALID_ARGUMENT,
                                 f"unknown table id {table_id}; the P4Info's tables are {known}")
        return table

    def counter(self, counter_id: int) -> BoundCounter:
        counter = self.counters.get(counter_id)
        if counter is None:
            known = ", ".join(f"{c.id} ({c.name})" for c in self.counters.values())
            raise P4RuntimeError(grpc.StatusCode.INVALID_ARGUMENT,
                                 f"unknown counter id {counter_id}; the P4Info's counters are "
                                 f"{known}")
        return counter


_UNSUPPORTED_P4INFO = ("action_profiles", "direct_counters", "meters", "direct_meters",
                       "controller_packet_metadata", "value_sets", "digests")


def bind_p4info(p4info: p4info_pb2.P4Info, pipeline: Pipeline,
                 defaults: dict[str, tuple[str, tuple[int, ...]]] | None = None) -> PipelineBinding:
    """The binding of `p4info` if it describes the program `pipeline` implements.

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
    _check_mode_names(p4info)
    binding = PipelineBinding()
    ids: dict[int, str] = {}
    for action in p4info.actions:
        _claim_id(ids, action.preamble)
        binding.action_ids[action.preamble.name] = action.preamble.id
    for counter in p4info.counters:
        _claim_id(ids, counter.preamble)
    by_name = {a.preamble.name: a for a in p4info.actions}
    p4_tables = {t.preamble.name: t for t in p4info.tables}
    for name in pipeline.tables:
        if name not in p4_tables and name not in TWO_LEVEL_TABLES:
            raise ConfigError(f"the P4Info has no table {name}, which the softswitch pipeline "
                              "implements: push the P4Info of p4src/v1model/hysync.p4")
    for name, table in p4_tables.items():
        _claim_id(ids, table.preamble)
        if name not in pipeline.tables:
            raise ConfigError(f"P4Info table {name} is not implemented by the softswitch "
                              f"pipeline (its tables: {', '.join(pipeline.tables)})")
        info = _check_table(table, pipeline.tables[name].size, by_name, binding, defaults[name])
        binding.tables[info.id] = info
        binding.table_ids[name] = info.id
    p4_counters = {c.preamble.name: c for c in p4info.counters}
    for name, counter in pipeline.counters.items():
        p4_counter = p4_counters.get(name)
        if p4_counter is None:
            raise ConfigError(f"the P4Info has no counter {name}, which the softswitch pipeline "
                              "implements")
        if p4_counter.size != counter.size:
            raise ConfigError(f"P4Info counter {name} has {p4_counter.size} cells, the softswitch "
                              f"pipeline's has {counter.size}")
        binding.counters[p4_counter.preamble.id] = BoundCounter(
            p4_counter.preamble.id, name, counter.size, p4_counter.spec.unit)
    for name in p4_counters:
        if name not in pipeline.counters:
            raise ConfigError(f"P4Info counter {name} is not implemented by the softswitch "
                              f"pipeline (its counters: {', '.join(pipeline.counters)})")
    return binding


def _check_mode_names(p4info: p4info_pb2.P4Info) -> None:
    """The modes' names a P4Info gives tools (type_info.serializable_enums, optional: older
    P4Infos have none) must be the wire's: a tool would otherwise show one mode as another."""
    enums = p4info.type_info.serializable_enums
    if MODE_ENUM not in enums:
        return
    named = {m.name: int.from_bytes(m.value, "big") for m in enums[MODE_ENUM].members}
    wire_modes = {m.name: int(m) for m in Mode}
    if named != wire_modes or enums[MODE_ENUM].underlying_type.bitwidth != 8:
        raise ConfigError(f"P4Info type_info serializable enum {MODE_ENUM} is "
                          f"{named} on {enums[MODE_ENUM].underlying_type.bitwidth} bits, the "
                          f"wire's modes are {wire_modes} on 8: push the P4Info of "
                          "p4src/v1model/hysync.p4")


def _claim_id(ids: dict[int, str], preamble: p4info_pb2.Preamble) -> None:
    if preamble.id == 0:
        raise ConfigError(f"P4Info object {preamble.name} has id 0; every id must be non-zero")
    other = ids.setdefault(preamble.id, preamble.name)
    if other != preamble.name:
        raise ConfigError(f"P4Info id {preamble.id} is used by both {other} and {preamble.name}")


def _check_table(table: p4info_pb2.Table, size: int, actions: dict[str, p4info_pb2.Action],
                 binding: PipelineBinding, default: tuple[str, tuple[int, ...]]) -> BoundTable:
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
    for field_name, bits, match_type in p4names.TABLE_KEYS[name]:
        kind = match_type.lower()
        f = p4_fields.pop(field_name, None)
        if f is None:
            raise ConfigError(f"P4Info table {name} has no match field {field_name} "
                              f"({bits} bits, {kind})")
        if f.bitwidth != bits or _KINDS.get(f.match_type) != kind:
            raise ConfigError(
                f"P4Info table {name} match field {field_name} is {f.bitwidth} bits "
                f"{p4info_pb2.MatchField.MatchType.Name(f.match_type)}, the softswitch's is "
                f"{bits} bits {kind.upper()}")
        fields.append(MatchFieldInfo(f.id, field_name, bits, kind))
    if p4_fields:
        raise ConfigError(f"P4Info table {name} has match field {next(iter(p4_fields))}, which "
                          "the softswitch pipeline does not match on")
    if len({f.id for f in fields}) != len(fields):
        raise ConfigError(f"P4Info table {name} has two match fields with the same id")
    allowed = p4names.TABLE_ACTIONS[name]
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
        _register_action(action, binding)
    default_id = table.const_default_action_id or table.initial_default_action.action_id
    default_name = (binding.actions[default_id].name if default_id in binding.actions
                    else p4names.NO_ACTION)
    if default_id and default_id not in scopes:
        raise ConfigError(f"P4Info table {name}'s default action id {default_id} is not one of "
                          "its actions")
    if default_name != default[0]:
        raise ConfigError(f"P4Info table {name}'s default action is {default_name}; the "
                          f"softswitch pipeline's is {default[0]}")
    initial = (default_name, _initial_params(table, binding, default_id, default[1]))
    return BoundTable(table.preamble.id, name, tuple(fields),
                     {f.id: i for i, f in enumerate(fields)}, scopes,
                     bool(table.const_default_action_id), initial, size,
                     any(f.kind != EXACT for f in fields))


def _register_action(action: p4info_pb2.Action, binding: PipelineBinding) -> None:
    name = action.preamble.name
    if action.preamble.id in binding.actions:
        return
    p4_params = {p.name: p for p in action.params}
    params = []
    for param_name, bits in p4names.ACTION_PARAMS[name]:
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
    binding.actions[action.preamble.id] = BoundAction(
        action.preamble.id, name, tuple(params), {p.id: i for i, p in enumerate(params)})


def _initial_params(table: p4info_pb2.Table, binding: PipelineBinding, action_id: int,
                    expected: tuple[int, ...]) -> tuple[int, ...]:
    if not table.HasField("initial_default_action") or action_id not in binding.actions:
        return expected
    action = binding.actions[action_id]
    values = [0] * len(action.params)
    for arg in table.initial_default_action.arguments:
        if arg.param_id in action.position:
            values[action.position[arg.param_id]] = int.from_bytes(arg.value, "big")
    if tuple(values) != expected:
        raise ConfigError(f"P4Info table {table.preamble.name}'s default action arguments "
                          f"{tuple(values)} differ from the softswitch pipeline's {expected}")
    return expected
