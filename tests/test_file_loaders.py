"""Every file a user names is loaded without a traceback: a value or the loader's own
one-line error naming the file. Property-based: arbitrary bytes; valid files with one field
set to an arbitrary TOML value, or to a number too large, too long or not finite; files
nested far deeper than any parser's recursion allows; files that never end."""

from __future__ import annotations

import json
import math
import os
import re
import subprocess
import sys
import tomllib
import uuid
from collections.abc import Callable
from pathlib import Path
from typing import Any

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from hysync import files
from hysync.controlplane.errors import DeviceConfigError, JobConfigError
from hysync.controlplane.job import JobConfig
from hysync.controlplane.p4rt.device_config import pack_tofino, read_device_config
from hysync.controlplane.policy.runner import latest_decision
from hysync.controlplane.testbed.inventory import Inventory, InventoryError
from hysync.errors import BadFileError
from hysync.p4schema import Schema
from hysync.topologies.scenario import ScenarioError, load_scenario

ROOT = Path(__file__).resolve().parents[1]
EXAMPLE_JOB = ROOT / "controlplane" / "examples" / "job-loopback.toml"
DEMO_SCENARIO = ROOT / "topologies" / "scenarios" / "demo.toml"
P4INFO = ROOT / "p4src" / "v1model" / "hysync.p4info.txtpb"

LOADERS: dict[str, tuple[Callable[[Path], object], type[Exception]]] = {
    "job": (JobConfig.load, JobConfigError),
    "scenario": (load_scenario, ScenarioError),
    "p4info": (Schema.from_file, BadFileError),
    "policy-log": (lambda path: latest_decision(path, 1), BadFileError),
    "inventory": (Inventory.load, InventoryError),
    "tofino-conf": (pack_tofino, DeviceConfigError),
    "device-config": (lambda path: read_device_config(path, "bmv2"), DeviceConfigError),
}
SYNTAX = {"job": "toml", "scenario": "toml", "inventory": "toml", "p4info": "textproto",
          "policy-log": "json", "tofino-conf": "json"}
INVENTORY = f"""name = "rack"
[switch]
grpc_addr = "127.0.0.1:9559"
target = "softswitch"
p4info = "{P4INFO}"
election_id = 10
data_ipv4 = "127.0.0.1"
data_udp_port = 48620
[pool]
job_slots = 32
averaging_slots = 8
[[hosts]]
name = "h1"
interface = "lo"
ipv4 = "127.0.0.1"
mac = "02:00:00:00:01:01"
switch_port = 1
"""
FAST = settings(max_examples=100, deadline=None,
                suppress_health_check=[HealthCheck.function_scoped_fixture])
SOME = settings(FAST, max_examples=30)  # examples that each build or read large files


def load_or_refuse(kind: str, path: Path) -> object | None:
    """The loader's value, or None after checking that its refusal is one line naming the
    file; any other exception fails the test."""
    loader, error = LOADERS[kind]
    try:
        return loader(path)
    except error as err:
        message = str(err)
        assert "\n" not in message and str(path) in message, message
        return None


# -------------------------------------------------------------- arbitrary bytes
BYTES = st.one_of(st.binary(max_size=400),
                  st.sampled_from([b"\xff\xfe\x00", b"\x80abc", "ipv4 = \"é\"".encode("latin-1")]),
                  st.builds(lambda head, tail: head[:tail] + b"\xc3",
                            st.sampled_from([EXAMPLE_JOB.read_bytes(), P4INFO.read_bytes()[:3000],
                                             DEMO_SCENARIO.read_bytes(), INVENTORY.encode()]),
                            st.integers(0, 3000)))


@pytest.mark.parametrize("kind", sorted(LOADERS))
@FAST
@given(data=BYTES)
def test_arbitrary_bytes_never_traceback(tmp_path: Path, kind: str, data: bytes) -> None:
    path = tmp_path / f"{kind}.file"
    path.write_bytes(data)
    load_or_refuse(kind, path)


# ----------------------------------------------------------- arbitrary TOML values
def toml_value(value: Any) -> str:
    """One TOML value, inline (tables as inline tables, so arrays of tables work too)."""
    if isinstance(value, bool):
        return "true" if value else "false"
    if isinstance(value, int):
        return str(value)
    if isinstance(value, float):
        return "nan" if math.isnan(value) else "inf" if value == math.inf else \
            "-inf" if value == -math.inf else repr(value)
    if isinstance(value, str):
        return json.dumps(value)
    if isinstance(value, list):
        return "[" + ", ".join(toml_value(v) for v in value) + "]"
    return "{" + ", ".join(f"{json.dumps(k)} = {toml_value(v)}" for k, v in value.items()) + "}"


def toml_document(data: dict[str, Any]) -> str:
    return "".join(f"{json.dumps(k)} = {toml_value(v)}\n" for k, v in data.items())


SCALARS = st.one_of(
    st.booleans(), st.integers(), st.integers(-2**70, 2**70).map(lambda v: v * 10**20),
    st.integers(300, 400).map(lambda e: 10**e),  # beyond a float
    st.floats(allow_nan=True, allow_infinity=True),
    st.text(st.characters(exclude_categories=["Cs"], exclude_characters="\x7f"), max_size=20),
    st.sampled_from(["١٢٧.0.0.1", "127.0.0.1", "٠٢:00:00:00:00:01", "partial", "async",
                     "constant", "dies"]))
VALUES = st.recursive(SCALARS, lambda inner: st.one_of(
    st.lists(inner, max_size=3),
    st.dictionaries(st.sampled_from(["worker", "factor", "mode", "x"]), inner, max_size=3)),
    max_leaves=8)


def field_paths(data: Any, prefix: tuple = ()) -> list[tuple]:
    """Every key path of a document, down into tables and arrays of tables."""
    paths = []
    items = data.items() if isinstance(data, dict) else enumerate(data)
    for key, value in items:
        paths.append((*prefix, key))
        if isinstance(value, dict | list) and value and all(
                isinstance(v, dict) for v in (value.values() if isinstance(value, dict)
                                              else value)) or isinstance(value, dict):
            paths += field_paths(value, (*prefix, key))
    return paths


def with_value(data: Any, path: tuple, value: Any) -> Any:
    data = json.loads(json.dumps(data))  # a deep copy
    holder = data
    for key in path[:-1]:
        holder = holder[key]
    holder[path[-1]] = value
    return data


def example(kind: str) -> dict[str, Any]:
    source = {"job": EXAMPLE_JOB, "scenario": DEMO_SCENARIO}[kind]
    scenario = tomllib.loads(source.read_text())
    if kind == "scenario":  # every optional table present, so each field gets a turn
        scenario.setdefault("link", {"delay_ms": 1.0, "bandwidth_mbit": 100.0})
        scenario.setdefault("schedule", [{"at_step": 10, "mode": "partial", "quorum": 2}])
    return scenario


@pytest.mark.parametrize("kind", ["job", "scenario"])
@FAST
@given(data=st.data(), value=VALUES)
def test_arbitrary_toml_values_never_traceback(tmp_path: Path, kind: str, data: st.DataObject,
                                               value: Any) -> None:
    document = example(kind)
    path_in_document = data.draw(st.sampled_from(field_paths(document)))
    file = tmp_path / f"{kind}.toml"
    file.write_text(toml_document(with_value(document, path_in_document, value)))
    load_or_refuse(kind, file)


# ------------------------------------------------------ values that must be accepted
@pytest.mark.parametrize("path,value,field", [
    (("scale",), math.inf, "scale"),
    (("scale",), 10**400, "scale"),
    (("quorum",), False, "quorum"),
    (("members", 0, "ipv4"), "١٢٧.0.0.1", "members[0].ipv4"),
    (("members", 0, "mac"), "٠٢:00:00:00:00:01", "members[0].mac"),
])
def test_job_files_refuse_what_the_switch_cannot_use(tmp_path: Path, path, value, field) -> None:
    file = tmp_path / "job.toml"
    file.write_text(toml_document(with_value(example("job"), path, value)))
    with pytest.raises(JobConfigError, match=rf"^{re.escape(f'{file}: {field}')}"):
        JobConfig.load(file)


@pytest.mark.parametrize("path,value,field", [
    (("compute_ms",), math.inf, "compute_ms"),
    (("straggler", 0, "factor"), math.inf, "factor"),
    (("steps",), 99999999999999999999, "steps"),
    (("compute_ms",), 10**400, "compute_ms"),
    (("straggler",), 3, "straggler"),
    (("link",), [], "link"),
])
def test_scenarios_refuse_what_a_run_cannot_use(tmp_path: Path, path, value, field) -> None:
    file = tmp_path / "scenario.toml"
    file.write_text(toml_document(with_value(example("scenario"), path, value)))
    with pytest.raises(ScenarioError, match=rf"^{re.escape(str(file))}.*'{field}'"):
        load_scenario(file)


# ------------------------------------------------------------------ deep nesting
DEEP = st.integers(70, 20_000)  # past MAX_DEPTH (64), up to far past the recursion limit


def toml_nested(shape: str, depth: int) -> str:
    """A TOML statement nesting `depth` deep in the given way."""
    if shape == "array":
        return "x = " + "[" * depth + "]" * depth
    if shape == "inline":
        return "x = " + "{a = " * depth + "1" + "}" * depth
    if shape == "mixed":
        return "x = " + "[{a = " * (depth // 2) + "1" + "}]" * (depth // 2)
    if shape == "dotted":  # no bracket at all: tables nested by the key
        return "a" + ".a" * depth + " = 1"
    return "[" + "a." * depth + "a]"  # a table header


def textproto_nested(shape: str, depth: int) -> str:
    opening, closing = {"braces": ("{ ", "}"), "angles": ("< ", ">"),
                        "colon": (": { ", "}")}[shape]
    return "tables { preamble " + opening * depth + closing * depth + " }"


@pytest.mark.parametrize("kind", ["job", "scenario", "inventory"])
@SOME
@given(shape=st.sampled_from(["array", "inline", "mixed", "dotted", "header"]), depth=DEEP,
       before=st.booleans())
def test_toml_nested_deep_is_refused_naming_the_file(tmp_path: Path, kind: str, shape: str,
                                                     depth: int, before: bool) -> None:
    valid = {"job": EXAMPLE_JOB.read_text(), "scenario": DEMO_SCENARIO.read_text(),
             "inventory": INVENTORY}[kind]
    nested = toml_nested(shape, depth)
    path = tmp_path / f"{kind}.toml"
    path.write_text(f"{nested}\n{valid}" if before else f"{valid}\n{nested}\n")
    assert load_or_refuse(kind, path) is None
    assert "nests" in refusal(kind, path) or "not valid TOML" in refusal(kind, path)


@SOME
@given(shape=st.sampled_from(["braces", "angles", "colon"]), depth=DEEP)
def test_p4info_nested_deep_is_refused_naming_the_file(tmp_path: Path, shape: str,
                                                       depth: int) -> None:
    path = tmp_path / "deep.txtpb"
    path.write_text(P4INFO.read_text() + textproto_nested(shape, depth))
    assert "nests more than 64 levels deep" in refusal("p4info", path)


@pytest.mark.parametrize("kind", ["policy-log", "tofino-conf"])
@SOME
@given(depth=DEEP, brace=st.booleans())
def test_json_nested_deep_is_refused_naming_the_file(tmp_path: Path, kind: str, depth: int,
                                                     brace: bool) -> None:
    nested = '{"a": ' * depth + "1" + "}" * depth if brace else "[" * depth + "]" * depth
    path = tmp_path / f"{kind}.json"
    path.write_text(f'{{"job_id": 2}}\n{nested}\n')
    assert "nest" in refusal(kind, path)


@pytest.mark.parametrize("syntax", ["toml", "textproto", "json"])
@SOME
@given(depth=st.integers(0, 20))
def test_shallow_brackets_in_strings_and_comments_are_not_nesting(syntax: str,
                                                                  depth: int) -> None:
    """Brackets inside strings and comments do not count: a name may hold any text."""
    noise = "[{<" * 100
    if syntax == "toml":
        text = (f'# {noise}\nnote = "{noise}"\nmore = \'{noise}\'\nlong = """\n{noise}\n"""\n'
                + "v = " + "[" * depth + "]" * depth)
    elif syntax == "textproto":
        text = f'# {noise}\nname: "{noise}"\nx ' + "{ " * depth + "}" * depth
    else:
        value: list = []
        for _ in range(depth):
            value = [value]
        text = json.dumps({"note": noise, "v": value})
    skip, opening, closing = {"toml": (files._TOML_SKIP, b"[{", b"]}"),
                              "textproto": (files._TEXTPROTO_SKIP, b"{<[", b"}>]"),
                              "json": (files._JSON_SKIP, b"[{", b"]}")}[syntax]
    assert files.nesting_error(text, skip, opening, closing, dotted=syntax == "toml") is None


def refusal(kind: str, path: Path) -> str:
    """The loader's one-line refusal of `path` (which names the file)."""
    loader, error = LOADERS[kind]
    with pytest.raises(error) as caught:
        loader(path)
    message = str(caught.value)
    assert "\n" not in message and str(path) in message, message
    return message


# ------------------------------------------- huge, long and non-finite numbers
NUMBERS = st.one_of(
    st.integers(20, 30_000).map(lambda n: "9" * n),  # past a float, past int()'s digit limit
    st.integers(20, 30_000).map(lambda n: "-" + "1" * n),
    st.integers(1, 4000).map(lambda n: "0x" + "f" * n),
    st.sampled_from(["inf", "-inf", "+inf", "nan", "-nan", "1e400", "-1e400", "1e-400", "-0.0",
                     "1180591620717411303424", "18446744073709551616", "-1"]))


def numeric_lines(text: str) -> list[str]:
    return [line for line in text.splitlines()
            if re.fullmatch(r"\w+ = [-+0-9.e]+\s*(#.*)?", line.strip())]


@pytest.mark.parametrize("kind", ["job", "scenario", "inventory"])
@SOME
@given(data=st.data(), number=NUMBERS)
def test_any_number_in_any_numeric_field_is_a_value_or_one_line(
        tmp_path: Path, kind: str, data: st.DataObject, number: str) -> None:
    valid = {"job": EXAMPLE_JOB.read_text(), "scenario": DEMO_SCENARIO.read_text(),
             "inventory": INVENTORY}[kind]
    line = data.draw(st.sampled_from(numeric_lines(valid)))
    path = tmp_path / f"{kind}.toml"
    path.write_text(valid.replace(line, f"{line.split(' = ')[0]} = {number}", 1))
    loaded = load_or_refuse(kind, path)
    if len(number.lstrip("-").removeprefix("0x")) > 4300 and "0x" not in number:
        assert loaded is None  # no field of any file takes a number of thousands of digits


# ------------------------------------------------------------------ endless files
@pytest.fixture
def small_limits(monkeypatch: pytest.MonkeyPatch) -> None:
    """The limits at 64 KiB, so that each example reads little (the device configs' is
    256 MiB)."""
    for name in ("TOML_LIMIT", "TEXT_LIMIT", "BINARY_LIMIT"):
        monkeypatch.setattr(files, name, 64 << 10)


@pytest.mark.parametrize("kind", sorted(LOADERS))
@settings(FAST, max_examples=10)
@given(chunk=st.binary(min_size=1, max_size=64) | st.sampled_from([b"x = 1\n", b"[", b"{ "]))
def test_a_file_that_never_ends_is_refused_after_the_limit(tmp_path: Path, small_limits: None,
                                                           kind: str, chunk: bytes) -> None:
    fifo = tmp_path / f"endless-{uuid.uuid4().hex}"
    os.mkfifo(fifo)
    held = os.open(fifo, os.O_RDWR)  # a writer from the start: the loader never sees EOF
    writer = _endless_writer(fifo, chunk)
    try:
        assert "is larger than 64 KiB" in refusal(kind, fifo)
    finally:
        writer.kill()
        writer.wait()
        os.close(held)


def _endless_writer(fifo: Path, chunk: bytes) -> subprocess.Popen:
    """A process writing `chunk` into `fifo` without end."""
    code = ("import sys\nc = bytes.fromhex(sys.argv[1]) * 4096\n"
            "f = open(sys.argv[2], 'wb', buffering=0)\nwhile True: f.write(c)")
    return subprocess.Popen([sys.executable, "-c", code, chunk.hex(), str(fifo)],
                            stderr=subprocess.DEVNULL)


@pytest.mark.parametrize("kind", sorted(LOADERS))
def test_dev_zero_is_refused_after_the_limit(small_limits: None, kind: str) -> None:
    assert "/dev/zero is larger than 64 KiB" in refusal(kind, Path("/dev/zero"))
