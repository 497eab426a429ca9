"""The P4Info-backed schema and the P4Runtime value codec, for both ends of P4Runtime.

Everything the control plane encodes goes through a `Schema`, so an unknown name
fails fast with the close names the pipeline does have, before any request is sent
(finsy's P4Schema is the model). Names are looked up by their fully qualified
P4Info name (`HySyncIngress.admission.members`) or, when unambiguous, by alias.
The softswitch's P4Runtime server reads a pushed P4Info through the same `Schema`
and decodes and encodes values with the same `encode_int`/`decode_int`
(docs/design.md, "One owner per name").
"""

from __future__ import annotations

import difflib
from collections.abc import Iterable, Mapping
from dataclasses import dataclass
from pathlib import Path
from typing import TypeVar

from google.protobuf import text_format
from p4.config.v1 import p4info_pb2 as p4i

from hysync import files, resources
from hysync.errors import BadFileError, HySyncError


class SchemaError(HySyncError, LookupError):
    """A P4Info name or id that the pipeline does not have, or an unusable P4Info."""


class P4InfoFileError(SchemaError, BadFileError):
    """A P4Info file that cannot be read or parsed."""


_P4INFO_FIX = "pass a text P4Info such as hysync:p4src/v1model/hysync.p4info.txtpb"


class EncodeError(HySyncError, ValueError):
    """A value that does not fit its P4Info field (width, sign, kind)."""


# ------------------------------------------------------------ bytestrings
def encode_int(value: int, bitwidth: int, what: str) -> bytes:
    """`value` as a canonical P4Runtime bytestring, refusing values wider than `bitwidth`.

    Canonical: the shortest big-endian string, `b"\\x00"` for zero (P4Runtime §8.3).
    """
    if not isinstance(value, int) or isinstance(value, bool):
        raise EncodeError(f"{what} must be an integer, got {value!r}")
    if value < 0:
        raise EncodeError(f"{what} = {value} is negative; P4Runtime values are unsigned")
    if bitwidth and value >> bitwidth:
        raise EncodeError(f"{what} = {value} does not fit in {bitwidth} bits "
                          f"(0..{(1 << bitwidth) - 1})")
    return value.to_bytes(max(1, (value.bit_length() + 7) // 8), "big")


def decode_int(data: bytes, bitwidth: int, what: str) -> int:
    """A P4Runtime bytestring (canonical or padded) as an int, checked against `bitwidth`."""
    value = int.from_bytes(data, "big")
    if bitwidth and value >> bitwidth:
        raise EncodeError(f"{what}: value 0x{data.hex()} does not fit in {bitwidth} bits "
                          f"(maximum {(1 << bitwidth) - 1})")
    return value


# ----------------------------------------------------------------- schema
MATCH_KINDS = {
    p4i.MatchField.EXACT: "exact",
    p4i.MatchField.LPM: "lpm",
    p4i.MatchField.TERNARY: "ternary",
    p4i.MatchField.RANGE: "range",
    p4i.MatchField.OPTIONAL: "optional",
}


@dataclass(frozen=True, slots=True)
class MatchFieldInfo:
    id: int
    name: str
    bitwidth: int
    kind: str  # exact | lpm | ternary | range | optional


@dataclass(frozen=True, slots=True)
class ParamInfo:
    id: int
    name: str
    bitwidth: int


@dataclass(frozen=True, slots=True)
class ActionInfo:
    id: int
    name: str
    alias: str
    params: tuple[ParamInfo, ...]

    def param(self, name: str) -> ParamInfo:
        return _find(f"parameter of action {self.name}", name, {p.name: p for p in self.params})

    def param_by_id(self, param_id: int) -> ParamInfo:
        for p in self.params:
            if p.id == param_id:
                return p
        raise SchemaError(f"action {self.name} has no parameter with id {param_id}")


@dataclass(frozen=True, slots=True)
class TableInfo:
    id: int
    name: str
    alias: str
    match_fields: tuple[MatchFieldInfo, ...]
    action_ids: tuple[int, ...]
    size: int

    @property
    def needs_priority(self) -> bool:
        """P4Runtime: a table with a ternary, range or optional field orders entries by priority."""
        return any(f.kind in ("ternary", "range", "optional") for f in self.match_fields)

    def match_field(self, name: str) -> MatchFieldInfo:
        return _find(f"match field of table {self.name}", name,
                     {f.name: f for f in self.match_fields})

    def match_field_by_id(self, field_id: int) -> MatchFieldInfo:
        for f in self.match_fields:
            if f.id == field_id:
                return f
        raise SchemaError(f"table {self.name} has no match field with id {field_id}")


@dataclass(frozen=True, slots=True)
class CounterInfo:
    id: int
    name: str
    alias: str
    size: int
    unit: str  # BYTES | PACKETS | BOTH


_T = TypeVar("_T")
_I = TypeVar("_I", TableInfo, ActionInfo, CounterInfo)


def _find(kind: str, name: str, by_name: Mapping[str, _T]) -> _T:
    found = by_name.get(name)
    if found is not None:
        return found
    close = difflib.get_close_matches(name, list(by_name), n=3, cutoff=0.5)
    if not close:  # a wrong prefix defeats difflib: try the last component
        tail = name.rsplit(".", 1)[-1]
        close = [n for n in by_name if n.rsplit(".", 1)[-1] == tail][:3]
    hint = f"; did you mean {', '.join(repr(c) for c in close)}?" if close else ""
    known = "" if close else f"; the P4Info has {', '.join(sorted(by_name)) or 'none'}"
    raise SchemaError(f"no {kind} named {name!r}{hint}{known}")


class Schema:
    """Lookups over one P4Info message. Immutable after construction."""

    def __init__(self, p4info: p4i.P4Info) -> None:
        self.p4info = p4info
        self._tables = {t.name: t for t in map(_table_info, p4info.tables)}
        self._actions = {a.name: a for a in map(_action_info, p4info.actions)}
        self._counters = {c.name: c for c in map(_counter_info, p4info.counters)}
        self._tables_by_id = {t.id: t for t in self._tables.values()}
        self._actions_by_id = {a.id: a for a in self._actions.values()}
        self._counters_by_id = {c.id: c for c in self._counters.values()}
        self._table_names = _with_aliases(self._tables.values())
        self._action_names = _with_aliases(self._actions.values())
        self._counter_names = _with_aliases(self._counters.values())

    # ---------------------------------------------------------- loading
    @classmethod
    def from_text(cls, text: str, *, source: str = "P4Info text") -> Schema:
        # The text-format parser recurses once per nested message: depth is checked first.
        files.check_nesting(source, text, "textproto", what="a P4Info", fix=_P4INFO_FIX,
                            error=P4InfoFileError)
        p4info = p4i.P4Info()
        try:
            text_format.Merge(text, p4info, allow_unknown_field=True)
        except text_format.ParseError as err:
            raise P4InfoFileError(f"{source} is not a text-format P4Info: {err}") from err
        except RecursionError:  # the check above leaves none; the last line of defence
            raise P4InfoFileError(f"{source} nests too deep to parse: {_P4INFO_FIX}") from None
        return cls(p4info)

    @classmethod
    def from_file(cls, path: str | Path) -> Schema:
        """A text P4Info file; `hysync:p4src/...` names one shipped with HySync."""
        if isinstance(path, str) and path.startswith(resources.PREFIX):
            try:
                path = resources.path(path[len(resources.PREFIX):])
            except FileNotFoundError as err:
                raise P4InfoFileError(str(err)) from None
        path = Path(path)
        text = files.read_text(path, what="the P4Info file", fix=_P4INFO_FIX,
                               error=P4InfoFileError)
        schema = cls.from_text(text, source=str(path))
        if not schema.p4info.tables:
            raise P4InfoFileError(f"{path} defines no tables: is it a P4Info file?")
        return schema

    # ---------------------------------------------------------- lookups
    def table(self, name: str) -> TableInfo:
        return _find("table", name, self._table_names)

    def action(self, name: str) -> ActionInfo:
        return _find("action", name, self._action_names)

    def counter(self, name: str) -> CounterInfo:
        return _find("counter", name, self._counter_names)

    def table_by_id(self, table_id: int) -> TableInfo:
        return _by_id("table", table_id, self._tables_by_id)

    def action_by_id(self, action_id: int) -> ActionInfo:
        return _by_id("action", action_id, self._actions_by_id)

    def counter_by_id(self, counter_id: int) -> CounterInfo:
        return _by_id("counter", counter_id, self._counters_by_id)

    @property
    def tables(self) -> tuple[TableInfo, ...]:
        return tuple(self._tables.values())

    @property
    def counters(self) -> tuple[CounterInfo, ...]:
        return tuple(self._counters.values())

    def check_action_of(self, table: TableInfo, action: ActionInfo) -> None:
        if action.id not in table.action_ids:
            allowed = ", ".join(self.action_by_id(i).name for i in table.action_ids)
            raise SchemaError(f"action {action.name} is not an action of table {table.name} "
                              f"(it takes {allowed})")


def _by_id(kind: str, ident: int, by_id: Mapping[int, _T]) -> _T:
    found = by_id.get(ident)
    if found is None:
        raise SchemaError(f"the P4Info has no {kind} with id {ident}: the switch and the "
                          "controller disagree on the pipeline; push it again")
    return found


def _with_aliases(infos: Iterable[_I]) -> dict[str, _I]:
    """Full names, plus each alias that names exactly one entity."""
    names: dict[str, _I] = {}
    aliases: dict[str, list[_I]] = {}
    for info in infos:
        names[info.name] = info
        if info.alias and info.alias != info.name:
            aliases.setdefault(info.alias, []).append(info)
    for alias, matches in aliases.items():
        if len(matches) == 1 and alias not in names:
            names[alias] = matches[0]
    return names


def _table_info(t: p4i.Table) -> TableInfo:
    fields = tuple(
        MatchFieldInfo(f.id, f.name, f.bitwidth, MATCH_KINDS.get(f.match_type, "unspecified"))
        for f in t.match_fields)
    return TableInfo(t.preamble.id, t.preamble.name, t.preamble.alias, fields,
                     tuple(ref.id for ref in t.action_refs), t.size)


def _action_info(a: p4i.Action) -> ActionInfo:
    params = tuple(ParamInfo(p.id, p.name, p.bitwidth) for p in a.params)
    return ActionInfo(a.preamble.id, a.preamble.name, a.preamble.alias, params)


def _counter_info(c: p4i.Counter) -> CounterInfo:
    unit = p4i.CounterSpec.Unit.Name(c.spec.unit)
    return CounterInfo(c.preamble.id, c.preamble.name, c.preamble.alias, c.size, unit)
