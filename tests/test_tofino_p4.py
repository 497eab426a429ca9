"""The TNA program (p4src/tna/) keeps the v1model program's control-plane contract.

Always: the TNA sources declare every table, key, action, parameter and counter of the
committed v1model P4Info under the same P4Info name, kind, width and size (read from the
P4 source with the small declaration parser of tests/test_headers_p4.py, not a P4
compiler); the committed TNA P4Infos (p4src/tna/hysync.<chip>.p4info.txtpb, the Tofino
compiler's output for each chip: they differ in the lane registers, and Tofino 2's has
the roles table and the weight register) agree with v1model's on every name and id the
controller uses (Tofino 1's without the roles table); the controller installs a job,
hot-swaps it and excludes a member through each on BMv2's code path; and
`make p4-tofino` says what to install when the compiler is missing.

With the Tofino compiler (bf-p4c on PATH, docs/tofino.md): each committed P4Info is what
it writes for its chip (its front end, seconds), and `make p4-tofino` compiles both chips
(its back end, minutes). Without it those tests skip and say why.
"""

from __future__ import annotations

import json
import os
import re
import shutil
import subprocess
from pathlib import Path

import pytest
from google.protobuf import text_format
from p4.config.v1 import p4info_pb2

from tests.test_headers_p4 import _strip_comments, parse_constants, parse_typedefs

ROOT = Path(__file__).resolve().parents[1]
V1MODEL_P4INFO = ROOT / "p4src" / "v1model" / "hysync.p4info.txtpb"
CHIPS = {"tofino": "tna", "tofino2": "t2na"}   # chip: architecture
TNA_P4INFOS = {chip: ROOT / "p4src" / "tna" / f"hysync.{chip}.p4info.txtpb" for chip in CHIPS}
# The generated wire.p4 first: the other files' constants are expressions over its names.
_SHARED = ROOT / "p4src" / "shared"
TNA_SOURCES = [_SHARED / "wire.p4"] + sorted(
    p for p in [*(ROOT / "p4src" / "tna").rglob("*.p4"), *_SHARED.rglob("*.p4")]
    if p != _SHARED / "wire.p4")
BF_P4C = os.environ.get("BF_P4C", "bf-p4c")
TNA_TYPEDEFS = {"PortId_t": 9}   # tna.p4 and t2na.p4: bit<9> on Tofino 1 and 2


def load_p4info(path: Path) -> p4info_pb2.P4Info:
    p4info = p4info_pb2.P4Info()
    text_format.Parse(path.read_text(), p4info, allow_unknown_field=True)
    return p4info


# ------------------------------------------------------------ the P4 source
def _blocks(text: str, keyword: str) -> dict[str, str]:
    """Bodies of `keyword name ... { body }` (brace-matched), by name."""
    bodies = {}
    for m in re.finditer(rf"\b{keyword}\s+(\w+)\b[^{{;]*\{{", text):
        depth, i = 1, m.end()
        while depth:
            depth += {"{": 1, "}": -1}.get(text[i], 0)
            i += 1
        bodies[m.group(1)] = text[m.end():i - 1]
    return bodies


class TnaSource:
    """Controls, instances, tables, actions and counters as the TNA program declares them."""

    def __init__(self, files: list[Path]) -> None:
        text = "\n".join(_strip_comments(f.read_text()) for f in files)
        self.constants = parse_constants(text)
        self.typedefs = parse_typedefs(text) | TNA_TYPEDEFS
        self.controls = _blocks(text, "control")

    def _owner(self, name: str) -> tuple[str, str]:
        """(body of the control that declares `name`'s last part, that part). A declaration
        named absolutely (@name(".HySyncIngress.admission.roles"), the roles table that
        control/roles.p4 declares under admission's names) is found by that name."""
        for body in self.controls.values():
            m = re.search(rf'@name\("\.{re.escape(name)}"\)\s*(?:action|table)\s+(\w+)', body)
            if m:
                return body, m.group(1)
        top, *path, leaf = name.split(".")
        body = self.controls[top]
        for instance in path:
            m = re.search(rf"\b(\w+)\s*\(\s*\)\s*{instance}\s*;", body)
            assert m, f"{name}: no instance {instance} in the control that should hold it"
            body = self.controls[m.group(1)]
        return body, leaf

    def table(self, name: str) -> tuple[list[tuple[str, str]], list[str], int]:
        """(keys as (P4Info name, match kind), action names, size) of table `name`."""
        body, leaf = self._owner(name)
        table = _blocks(body, "table").get(leaf)
        assert table is not None, f"no table {name} in the TNA program"
        keys = re.findall(r":\s*(\w+)\s*@name\(\"(\w+)\"\)", table)
        actions = re.search(r"\bactions\s*=\s*\{(.*?)\}", table, re.S)
        size = re.search(r"\bsize\s*=\s*(\w+)\s*;", table)
        assert actions and size, f"table {name}: no actions or size"
        names = [a.split()[-1] for a in actions.group(1).replace(";", " ; ").split(";")
                 if a.strip()]
        return [(k, kind) for kind, k in keys], names, self.constants[size.group(1)]

    def action_params(self, name: str) -> list[tuple[str, int]]:
        """(P4Info name, width) of each parameter of action `name`."""
        body, leaf = self._owner(name)
        m = re.search(rf"\baction\s+{leaf}\s*\(", body)
        assert m, f"no action {name} in the TNA program"
        depth, end = 1, m.end()
        while depth:
            depth += {"(": 1, ")": -1}.get(body[end], 0)
            end += 1
        params = []
        for decl in filter(None, (p.strip() for p in body[m.end():end - 1].split(","))):
            p = re.fullmatch(r"(?:@name\(\"(\w+)\"\)\s+)?(?:bit<(\d+)>|(\w+))\s+(\w+)", decl)
            assert p, f"action {name}: cannot read parameter {decl!r}"
            width = int(p.group(2)) if p.group(2) else self.typedefs[p.group(3)]
            params.append((p.group(1) or p.group(4), width))
        return params

    def counter_size(self, name: str) -> int:
        body, leaf = self._owner(name)
        m = re.search(rf"\bCounter\s*<[^()]*?>\s*\(\s*(\w+)\s*,[^)]*\)\s*{leaf}\s*;", body)
        assert m, f"no Counter {name} in the TNA program"
        return self.constants[m.group(1)]


MATCH_KINDS = {p4info_pb2.MatchField.EXACT: "exact", p4info_pb2.MatchField.RANGE: "range",
               p4info_pb2.MatchField.TERNARY: "ternary", p4info_pb2.MatchField.LPM: "lpm"}


@pytest.fixture(scope="module")
def v1model() -> p4info_pb2.P4Info:
    return load_p4info(V1MODEL_P4INFO)


# The chips whose program declares the roles table (a job's spine, docs/tofino.md "Two
# levels"); Tofino 1's runs every job at one level.
ROLES_CHIPS = {"tofino2"}


def _one_level(p4info: p4info_pb2.P4Info) -> p4info_pb2.P4Info:
    """The v1model P4Info without the roles table of a job at two levels and its action
    (docs/protocol.md §11), which the Tofino 1 program leaves out."""
    from hysync import p4names
    from hysync.softswitch.p4binding import TWO_LEVEL_TABLES

    out = p4info_pb2.P4Info()
    out.CopyFrom(p4info)
    only = {a for t in TWO_LEVEL_TABLES for a in p4names.TABLE_ACTIONS[t]} - {p4names.NO_ACTION}
    kept_tables = [t for t in out.tables if t.preamble.name not in TWO_LEVEL_TABLES]
    kept_actions = [a for a in out.actions if a.preamble.name not in only]
    del out.tables[:], out.actions[:]
    out.tables.extend(kept_tables)
    out.actions.extend(kept_actions)
    return out


@pytest.fixture(scope="module")
def tna_source() -> TnaSource:
    return TnaSource(TNA_SOURCES)


def test_tna_source_declares_every_v1model_table(v1model, tna_source):
    action_names = {a.preamble.id: a.preamble.name.split(".")[-1] for a in v1model.actions}
    for table in v1model.tables:
        keys, actions, size = tna_source.table(table.preamble.name)
        assert keys == [(f.name, MATCH_KINDS[f.match_type]) for f in table.match_fields], \
            table.preamble.name
        assert sorted(actions) == sorted(action_names[a.id] for a in table.action_refs), \
            table.preamble.name
        assert size == table.size, table.preamble.name


def test_tna_source_declares_every_v1model_action_with_its_parameters(v1model, tna_source):
    for action in v1model.actions:
        if action.preamble.name == "NoAction":
            continue
        assert tna_source.action_params(action.preamble.name) == \
            [(p.name, p.bitwidth) for p in action.params], action.preamble.name


def test_tna_source_declares_every_v1model_counter(v1model, tna_source):
    for counter in v1model.counters:
        assert tna_source.counter_size(counter.preamble.name) == counter.size, \
            counter.preamble.name


def test_source_check_sees_a_renamed_key(v1model, tmp_path):
    """The source check fails when a key's P4Info name drifts (it reads what it claims)."""
    forwarding = ROOT / "p4src" / "tna" / "include" / "control" / "forwarding.p4"
    drifted = tmp_path / "forwarding.p4"
    drifted.write_text(forwarding.read_text().replace('@name("dst_addr")', '@name("dst_mac")'))
    source = TnaSource([*(f for f in TNA_SOURCES if f != forwarding), drifted])
    l2 = next(t for t in v1model.tables if t.preamble.name.endswith(".l2"))
    keys, _, _ = source.table(l2.preamble.name)
    assert keys != [(f.name, MATCH_KINDS[f.match_type]) for f in l2.match_fields]


# --------------------------------------------------------------- make p4-tofino
def test_make_p4_tofino_says_what_to_install_without_the_compiler():
    result = subprocess.run(["make", "--no-print-directory", "p4-tofino",
                             "BF_P4C=hysync-no-such-compiler"],
                            cwd=ROOT, capture_output=True, text=True, timeout=60)
    assert result.returncode != 0
    assert "hysync-no-such-compiler is not on PATH" in result.stdout
    assert "ENABLE_TOFINO=ON" in result.stdout and "docs/tofino.md" in result.stdout


needs_compiler = pytest.mark.skipif(
    shutil.which(BF_P4C) is None,
    reason=f"{BF_P4C} (the open-source Tofino compiler) is not on PATH: docs/tofino.md says "
           "how to build it")


def _contract(p4info: p4info_pb2.P4Info) -> dict[str, object]:
    """Everything of a P4Info the controller uses: tables, actions, counters (not registers,
    which differ by target and which no control plane here touches). Counters by name:
    bf-p4c 1.2.5.8 numbers a TNA extern from its pipe-prefixed name and ignores @id on it
    (bfruntime_arch_handler.h, collectExternInstanceCommon), so their ids differ from
    v1model's; the controller resolves every counter by name from the pushed P4Info."""
    return {
        "tables": {t.preamble.name: (t.preamble.id, t.size, [
            (f.id, f.name, f.bitwidth, f.match_type) for f in t.match_fields],
            sorted(a.id for a in t.action_refs), t.const_default_action_id)
            for t in p4info.tables},
        "actions": {a.preamble.name: (a.preamble.id, [(p.id, p.name, p.bitwidth)
                                                       for p in a.params])
                    for a in p4info.actions},
        "counters": {c.preamble.name: (c.size, c.spec.unit) for c in p4info.counters},
    }


@pytest.mark.parametrize("chip", CHIPS)
def test_committed_tna_p4info_agrees_with_v1model(v1model, chip):
    contract = v1model if chip in ROLES_CHIPS else _one_level(v1model)
    assert _contract(load_p4info(TNA_P4INFOS[chip])) == _contract(contract)


def test_agreement_check_sees_a_drifted_id(v1model):
    """The agreement check compares ids, not only names (it fails on what it claims)."""
    tna = load_p4info(TNA_P4INFOS["tofino"])
    tna.tables[0].preamble.id += 1
    assert _contract(tna) != _contract(v1model)


def _front_end_p4info(chip: str, arch: str, out: Path) -> str:
    """The compiler's P4Info text for one chip, from its front and mid end only (the back
    end, which places the program on the chip, is skipped: `--skip-compilation pipe`)."""
    result = subprocess.run([BF_P4C, "--target", chip, "--arch", arch, "--std", "p4-16",
                             "--p4runtime-force-std-externs", "--skip-compilation", "pipe",
                             "--p4runtime-files", str(out / "hysync.p4info.txtpb"),
                             "-o", str(out), str(ROOT / "p4src" / "tna" / "hysync.p4")],
                            capture_output=True, text=True, timeout=900)
    assert result.returncode == 0, result.stderr[-3000:]
    return (out / "hysync.p4info.txtpb").read_text()


@needs_compiler
@pytest.mark.parametrize("chip", CHIPS)
def test_committed_tna_p4info_is_the_compilers(chip, tmp_path):
    # Compared as text: the P4Info holds a barefoot.PortMetadata Any, which the Python
    # protobuf cannot unpack.
    assert _front_end_p4info(chip, CHIPS[chip], tmp_path) == TNA_P4INFOS[chip].read_text(), \
        f"regenerate p4src/tna/hysync.{chip}.p4info.txtpb as docs/tofino.md says"


@pytest.fixture(scope="module")
def make_p4_tofino(tmp_path_factory):
    """One `make p4-tofino` (both chips, 5-15 minutes on 2 cores) for the tests below."""
    out = tmp_path_factory.mktemp("tna")
    result = subprocess.run(["make", "--no-print-directory", "p4-tofino",
                             f"TNA_OUT={out}", f"BF_P4C={BF_P4C}"],
                            cwd=ROOT, capture_output=True, text=True, timeout=7200)
    return result, out


def _assert_compiled(make_result, chip: str, binary: str) -> None:
    result, out = make_result
    log = result.stdout[-3000:] + result.stderr[-3000:]
    assert f"{chip}: compiled" in result.stdout, log
    for name in ("hysync.conf", "hysync.p4info.txtpb", "bfrt.json", "pipe/context.json",
                 f"pipe/{binary}", "pipe/logs/resources.json"):
        assert (out / chip / name).is_file(), f"{chip}/{name}"
    assert f"| {chip} | " in (out / "resources.md").read_text()


@needs_compiler
def test_make_p4_tofino_compiles_tofino_2(make_p4_tofino):
    _assert_compiled(make_p4_tofino, "tofino2", "tofino2.bin")


@needs_compiler
def test_make_p4_tofino_compiles_tofino_1(make_p4_tofino):
    # With no stage to spare (docs/tofino.md, How Tofino 1 fits): bfas refuses a placement
    # longer than 12 stages, and then tofino.bin is missing.
    _assert_compiled(make_p4_tofino, "tofino", "tofino.bin")
    assert make_p4_tofino[0].returncode == 0


def test_resource_summary_says_what_is_missing(tmp_path, capsys):
    from bench.tofino_resources import main
    assert main(["tofino_resources", str(tmp_path)]) == 1
    assert "no successful compile for tofino, tofino2" in capsys.readouterr().err


def test_resource_summary_skips_a_chip_whose_compile_failed(tmp_path):
    # A failed compile leaves a partial resources.json behind: only the manifest's verdict
    # tells it from a placed program.
    from bench.tofino_resources import compiled
    for chip, succeeded in (("tofino", False), ("tofino2", True)):
        (tmp_path / chip / "pipe" / "logs").mkdir(parents=True)
        (tmp_path / chip / "pipe" / "logs" / "resources.json").write_text("{}")
        (tmp_path / chip / "manifest.json").write_text(
            json.dumps({"compilation_succeeded": succeeded}))
    assert not compiled(tmp_path / "tofino")
    assert compiled(tmp_path / "tofino2")
    assert not compiled(tmp_path / "absent")


def test_resource_summary_flags_a_placement_longer_than_the_chip():
    # bf-p4c's back end alone calls a 20-stage Tofino 1 placement a success.
    from bench.tofino_resources import ChipResources, Stage, summary
    stages = tuple(Stage(n, 1, 1, 0, 1, ("round",)) for n in range(20))
    long = ChipResources("tofino", 12, stages, 4, 80, 24, {8: 1, 16: 1, 32: 1})
    short = ChipResources("tofino2", 20, stages[:18], 4, 80, 24, {8: 1, 16: 1, 32: 1})
    assert not long.fits and short.fits
    text = summary([long, short])
    assert "| tofino | 20 of 12 (does not fit) |" in text
    assert "| tofino2 | 18 of 20 |" in text


# ------------------------------------------------- the controller on the TNA P4Info
@pytest.mark.parametrize("chip", CHIPS)
def test_controller_drives_the_tna_p4info_on_the_bmv2_code_path(chip):
    from hysync.controlplane.controller import Controller
    from hysync.controlplane.p4rt.switch import Switch
    from hysync.softswitch.pipeline import Pipeline
    from hysync.softswitch.server import serve
    from hysync.wire import Mode
    from tests.controlplane.conftest import make_job

    server, port = serve(Pipeline(), "127.0.0.1:0")
    try:
        with Switch(f"127.0.0.1:{port}") as switch:
            switch.push_pipeline(TNA_P4INFOS[chip])
            controller = Controller(switch).attach()
            controller.add_job(make_job(1, workers=4))
            controller.set_mode(1, slots=(0, 127), mode=Mode.PARTIAL, quorum=3)
            controller.exclude(1, 3)
            [job] = controller.list_jobs()
            assert sorted(job.active) == [0, 1, 2]
            assert {(s.low, s.high, s.mode) for s in job.segments()} >= {(0, 127, Mode.PARTIAL)}
    finally:
        server.stop(None)
