"""Every file a user names is loaded without a traceback: a value or the loader's own
one-line error naming the file. Property-based: arbitrary bytes, and
valid files with one field set to an arbitrary TOML value."""

from __future__ import annotations

import json
import math
import re
import tomllib
from collections.abc import Callable
from pathlib import Path
from typing import Any

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from hysync.controlplane.errors import JobConfigError
from hysync.controlplane.job import JobConfig
from hysync.controlplane.policy_runner import latest_decision
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
}
FAST = settings(max_examples=100, deadline=None,
                suppress_health_check=[HealthCheck.function_scoped_fixture])


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
                                             DEMO_SCENARIO.read_bytes()]),
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
