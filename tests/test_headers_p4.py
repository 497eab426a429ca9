"""The P4 program mirrors hysync/wire.py: header layout, lanes and constants.

The wire format's P4 side is generated (p4src/shared/wire.p4, `python -m hysync.codegen`);
these tests read the generated and the hand-written P4 with a small parser (regexes over
the declarations this project writes, not a general P4 parser) and compare them with the
wire format owner, so a generator that writes something else fails here, and
tests/test_codegen.py fails when a committed file is not what the generator writes.
When p4c is on PATH the program is compiled and the P4Info it produces must equal the
committed p4src/v1model/hysync.p4info.txtpb, which the softswitch and the controller load.
"""

from __future__ import annotations

import ast
import operator
import re
import shutil
import subprocess
from pathlib import Path

import pytest

from hysync import wire
from hysync.softswitch.levels import Level
from tests.p4tools import skip_unless_available

ROOT = Path(__file__).resolve().parents[1]
SHARED = ROOT / "p4src" / "shared"
V1MODEL = ROOT / "p4src" / "v1model"
P4INFO = V1MODEL / "hysync.p4info.txtpb"


# ----------------------------------------------------------------- the parser
def _strip_comments(text: str) -> str:
    text = re.sub(r"/\*.*?\*/", "", text, flags=re.S)
    return re.sub(r"//[^\n]*", "", text)


_BINOPS = {ast.Add: operator.add, ast.Sub: operator.sub, ast.Mult: operator.mul,
           ast.LShift: operator.lshift}


def _evaluate(expr: str, names: dict[str, int]) -> int | None:
    """Value of an integer constant expression over known names, or None."""
    expr = re.sub(r"\b\d+w(\d+)\b", r"\1", expr.strip())  # P4 width-prefixed literals
    try:
        tree = ast.parse(expr, mode="eval").body
    except SyntaxError:
        return None

    def ev(node: ast.AST) -> int | None:
        if isinstance(node, ast.Constant) and isinstance(node.value, int):
            return node.value
        if isinstance(node, ast.Name):
            return names.get(node.id)
        if isinstance(node, ast.BinOp) and type(node.op) in _BINOPS:
            left, right = ev(node.left), ev(node.right)
            return None if left is None or right is None else _BINOPS[type(node.op)](left, right)
        return None

    return ev(tree)


def parse_constants(text: str) -> dict[str, int]:
    """`#define NAME expr` and `const type NAME = expr;`, in file order."""
    names: dict[str, int] = {}
    text = _strip_comments(text)
    pattern = re.compile(
        r"^\s*#define\s+(?P<dname>[A-Za-z_]\w*)[ \t]+(?P<dvalue>[^\n\\]+)$"
        r"|\bconst\s+[\w<>]+\s+(?P<cname>[A-Za-z_]\w*)\s*=\s*(?P<cvalue>[^;]+);",
        re.M)
    for m in pattern.finditer(text):
        name = m.group("dname") or m.group("cname")
        value = _evaluate(m.group("dvalue") or m.group("cvalue"), names)
        if value is not None:
            names[name] = value
    return names


def parse_typedefs(text: str) -> dict[str, int]:
    """Widths of `typedef bit<W> name;` and of serializable enums `enum bit<W> name {`."""
    text = _strip_comments(text)
    return {name: int(width) for width, name in
            re.findall(r"\btypedef\s+bit<(\d+)>\s+(\w+)\s*;", text)
            + re.findall(r"\benum\s+bit<(\d+)>\s+(\w+)\s*\{", text)}


def parse_header(text: str, name: str, typedefs: dict[str, int]) -> list[tuple[str, int]]:
    """Fields of `header name { ... }` as (field, width), in declaration order."""
    body = re.search(rf"\bheader\s+{name}\s*\{{(.*?)\}}", _strip_comments(text), re.S)
    if body is None:
        raise AssertionError(f"no `header {name}` in the P4 source")
    fields = []
    for decl in filter(None, (d.strip() for d in body.group(1).split(";"))):
        m = re.fullmatch(r"(?:bit<(\d+)>|(\w+))\s+(\w+)", decl)
        if m is None:
            raise AssertionError(f"cannot read field declaration {decl!r} of {name}")
        width = int(m.group(1)) if m.group(1) else typedefs.get(m.group(2))
        if width is None:
            raise AssertionError(f"field {m.group(3)} of {name}: unknown type {m.group(2)}")
        fields.append((m.group(3), width))
    return fields


def parse_stack(text: str, header: str) -> tuple[str, str]:
    """(size expression, member name) of the `header[size] member;` stack in headers_t."""
    m = re.search(rf"\b{header}\s*\[\s*(\w+)\s*\]\s*(\w+)\s*;", _strip_comments(text))
    if m is None:
        raise AssertionError(f"no `{header}[N] name;` header stack in headers_t")
    return m.group(1), m.group(2)


# --------------------------------------------------------------------- fixtures
@pytest.fixture(scope="module")
def defines_text() -> str:
    return "\n".join((SHARED / name).read_text()
                     for name in ("wire.p4", "decision.p4", "defines.p4"))


@pytest.fixture(scope="module")
def headers_text() -> str:
    return (SHARED / "wire.p4").read_text() + (SHARED / "headers.p4").read_text()


@pytest.fixture(scope="module")
def constants(defines_text: str) -> dict[str, int]:
    return parse_constants(defines_text)


@pytest.fixture(scope="module")
def typedefs(defines_text: str) -> dict[str, int]:
    return parse_typedefs(defines_text)


# ------------------------------------------------------------------ the header
def test_hysync_header_fields_match_wire_header_fields(headers_text, typedefs):
    assert parse_header(headers_text, "hysync_h", typedefs) == list(wire.HEADER_FIELDS)


def test_hysync_header_is_header_bytes_long(headers_text, typedefs):
    bits = sum(width for _, width in parse_header(headers_text, "hysync_h", typedefs))
    assert bits == 8 * wire.HEADER_BYTES


def test_lanes_are_a_stack_of_lanes_int32_lanes(headers_text, typedefs, constants):
    assert parse_header(headers_text, "lane_h", typedefs) == [("value", 32)]
    size, member = parse_stack(headers_text, "lane_h")
    assert member == "lanes"
    count = int(size) if size.isdigit() else constants[size]
    assert count == wire.LANES
    assert count * 4 == wire.PAYLOAD_BYTES


@pytest.mark.parametrize(("header", "nbytes"), [
    ("ethernet_h", wire.ETH_BYTES), ("ipv4_h", wire.IPV4_BYTES), ("udp_h", wire.UDP_BYTES)])
def test_frame_headers_have_the_wire_sizes(headers_text, typedefs, header, nbytes):
    assert sum(width for _, width in parse_header(headers_text, header, typedefs)) == 8 * nbytes


def test_parser_sees_a_reordered_or_resized_field(typedefs):
    """The comparison above can fail: a swapped or resized field is read as such."""
    swapped = "header hysync_h { bit<8> op; bit<8> version; }"
    assert parse_header(swapped, "hysync_h", typedefs) == [("op", 8), ("version", 8)]
    assert parse_header(swapped, "hysync_h", typedefs) != list(wire.HEADER_FIELDS[:2])
    resized = "header hysync_h { bit<8> version; slot_t op; }"
    assert parse_header(resized, "hysync_h", typedefs) == [("version", 8), ("op", 16)]


# ------------------------------------------------------------------ constants
@pytest.mark.parametrize(("p4_name", "value"), [
    ("HYSYNC_UDP_PORT", wire.HYSYNC_UDP_PORT),
    ("HYSYNC_VERSION", wire.VERSION),
    ("LANES", wire.LANES),
    ("MAX_WORKERS", wire.MAX_WORKERS),
    ("MAX_JOBS", wire.MAX_JOBS),
    ("NUM_SLOTS", wire.NUM_SLOTS),
    ("NUM_DROP_REASONS", wire.NUM_DROP_REASONS),
    ("FLOOD_MCAST_GROUP", wire.FLOOD_MCAST_GROUP),
    ("HYSYNC_HEADER_BYTES", wire.HEADER_BYTES),
    ("CONTRIB_UDP_LEN", wire.UDP_BYTES + wire.PACKET_BYTES),
    ("CONTRIB_IPV4_LEN", wire.IPV4_BYTES + wire.UDP_BYTES + wire.PACKET_BYTES),
    ("CONTRIB_FRAME_LEN", wire.HYSYNC_OFFSET + wire.PACKET_BYTES),
    ("REPLY_UDP_LEN", wire.UDP_BYTES + wire.HEADER_BYTES),
    ("REPLY_IPV4_LEN", wire.IPV4_BYTES + wire.UDP_BYTES + wire.HEADER_BYTES),
    ("ETHERTYPE_IPV4", wire.ETHERTYPE_IPV4),
    ("IP_PROTO_UDP", wire.IPPROTO_UDP),
    ("TX_MASK", wire.TX_MASK),
])
def test_constant_matches_wire(constants, p4_name, value):
    assert constants.get(p4_name) == value, f"{p4_name} in wire.p4"


@pytest.mark.parametrize(("prefix", "enum", "skip"), [
    ("OP_", wire.Op, ()),
    ("MODE_", wire.Mode, ()),
    ("FLAG_", wire.Flag, ("NONE",)),
    ("RESYNC_", wire.ResyncReason, ()),
    ("DROP_", wire.DropReason, ()),
    ("LEVEL_", Level, ()),
])
def test_enumeration_matches_wire(constants, prefix, enum, skip):
    """Same members and values both ways: a value added on one side only fails."""
    p4 = {name[len(prefix):]: value for name, value in constants.items()
          if name.startswith(prefix)}
    py = {member.name: int(member.value) for member in enum if member.name not in skip}
    assert p4 == py


def test_drop_reasons_fit_a_jobs_block_of_the_drops_counter(constants):
    reasons = [v for k, v in constants.items() if k.startswith("DROP_")]
    assert max(reasons) < constants["NUM_DROP_REASONS"]


def test_for_each_lane_lists_every_lane_once(defines_text, constants):
    m = re.search(r"#define\s+FOR_EACH_LANE\(X\)((?:[^\n]*\\\n)*[^\n]*)", defines_text)
    assert m is not None, "FOR_EACH_LANE(X) is not defined in wire.p4"
    indices = [int(i) for i in re.findall(r"\bX\((\d+)\)", m.group(1))]
    assert indices == list(range(constants["LANES"]))


# --------------------------------------------------------------- the P4Info
def _p4info_pb2():
    return pytest.importorskip("p4.config.v1.p4info_pb2")


def _p4info_message(text: str):
    text_format = pytest.importorskip("google.protobuf.text_format")
    return text_format.Parse(text, _p4info_pb2().P4Info())


# docs/protocol.md §8: (name, [(match field, bits, kind)], {action: [(param, bits)]}).
# Spelled out here on purpose, the one copy outside p4src/ and hysync/p4names.py: the
# generated names come from the P4Info, so only an independent copy of the documented
# contract can tell that the P4 program (and so the P4Info) drifted from the document.
CONTRACT_TABLES = {
    "HySyncIngress.admission.members": (
        [("job_id", 16, "EXACT"), ("worker_id", 8, "EXACT"), ("src_addr", 32, "EXACT"),
         ("src_port", 16, "EXACT")],
        {"HySyncIngress.admission.admit": [], "NoAction": []}),
    "HySyncIngress.admission.jobs": (
        [("job_id", 16, "EXACT")],
        {"HySyncIngress.admission.set_job": [("slot_base", 16), ("slot_count", 16),
                                             ("members", 8), ("mcast_grp", 16), ("epoch", 32)],
         "NoAction": []}),
    "HySyncIngress.admission.roles": (
        [("job_id", 16, "EXACT")],
        {"HySyncIngress.admission.set_role": [("level", 8), ("uplink_id", 8), ("spine_addr", 32),
                                              ("spine_mac", 48), ("leaf_addr", 32)],
         "NoAction": []}),
    "HySyncIngress.sync_mode.modes": (
        [("job_id", 16, "EXACT"), ("slot", 16, "RANGE")],
        {"HySyncIngress.sync_mode.set_mode": [("mode", 8), ("quorum", 8)], "NoAction": []}),
    "HySyncIngress.forwarding.l2": (
        [("dst_addr", 48, "EXACT")],
        {"HySyncIngress.forwarding.set_egress_port": [("port", 9)],
         "HySyncIngress.forwarding.flood": []}),
    "HySyncEgress.replication.rewrite": (
        [("egress_rid", 16, "EXACT")],
        {"HySyncEgress.replication.rewrite_dst": [("dst_mac", 48), ("dst_addr", 32),
                                                  ("dst_port", 16)],
         "NoAction": []}),
}
CONTRACT_DEFAULTS = {
    "HySyncIngress.admission.members": "NoAction",
    "HySyncIngress.admission.jobs": "NoAction",
    "HySyncIngress.admission.roles": "NoAction",
    "HySyncIngress.sync_mode.modes": "NoAction",
    "HySyncIngress.forwarding.l2": "HySyncIngress.forwarding.flood",
    "HySyncEgress.replication.rewrite": "NoAction",
}
CONTRACT_COUNTERS = {
    "HySyncIngress.stats.contributions": wire.MAX_JOBS * wire.MAX_WORKERS,
    "HySyncIngress.stats.late": wire.MAX_JOBS * wire.MAX_WORKERS,
    "HySyncIngress.stats.duplicates": wire.MAX_JOBS * wire.MAX_WORKERS,
    "HySyncIngress.stats.stale": wire.MAX_JOBS * wire.MAX_WORKERS,
    "HySyncIngress.stats.closes": wire.MAX_JOBS * wire.MAX_WORKERS,
    "HySyncIngress.stats.drops": wire.MAX_JOBS * wire.NUM_DROP_REASONS,
    "HySyncIngress.stats.switch_drops": wire.NUM_DROP_REASONS,
    "HySyncEgress.replication.results": wire.MAX_JOBS * wire.MAX_WORKERS,
}


def test_committed_p4info_is_the_control_plane_contract():
    p4info_pb2 = _p4info_pb2()
    info = _p4info_message(P4INFO.read_text())
    kind = p4info_pb2.MatchField.MatchType.Name
    actions = {a.preamble.id: a for a in info.actions}
    action_names = {a.preamble.name: a for a in info.actions}

    assert {t.preamble.name for t in info.tables} == set(CONTRACT_TABLES)
    for table in info.tables:
        fields, table_actions = CONTRACT_TABLES[table.preamble.name]
        assert [(f.name, f.bitwidth, kind(f.match_type)) for f in table.match_fields] == fields
        refs = {actions[r.id].preamble.name for r in table.action_refs}
        assert refs == set(table_actions), table.preamble.name
        for name, params in table_actions.items():
            assert [(p.name, p.bitwidth) for p in action_names[name].params] == params
        default = CONTRACT_DEFAULTS[table.preamble.name]
        assert actions[table.const_default_action_id].preamble.name == default

    assert {c.preamble.name: (c.size, c.spec.unit) for c in info.counters} == {
        name: (size, p4info_pb2.CounterSpec.BOTH) for name, size in CONTRACT_COUNTERS.items()}
    assert info.pkg_info.arch == "v1model"


def test_compiled_p4info_equals_the_committed_one(tmp_path):
    skip_unless_available(
        None if shutil.which("p4c") else "p4c is not on PATH, so the committed P4Info was "
        "compared with nothing: install p4c (docs/bmv2.md) to check it")
    produced = tmp_path / "hysync.p4info.txtpb"
    result = subprocess.run(
        ["p4c", "--target", "bmv2", "--arch", "v1model", "--p4runtime-files", str(produced),
         "-o", str(tmp_path), str(V1MODEL / "hysync.p4")],
        capture_output=True, text=True, timeout=600, check=False)
    assert result.returncode == 0, f"p4c failed:\n{result.stderr}"
    assert _p4info_message(produced.read_text()) == _p4info_message(P4INFO.read_text()), (
        "the committed P4Info is stale: regenerate it with "
        "`p4c --target bmv2 --arch v1model --p4runtime-files "
        "p4src/v1model/hysync.p4info.txtpb -o build/p4 p4src/v1model/hysync.p4`")
