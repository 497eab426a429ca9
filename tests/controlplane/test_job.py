"""Job files: the example loads, and every invalid field is named with its fix."""

from __future__ import annotations

from typing import Any

import pytest

from hysync.controlplane.errors import JobConfigError
from hysync.controlplane.job import JobConfig
from hysync.wire import Mode
from tests.nested_data import DELETE, changed

from .conftest import EXAMPLE_JOB


def test_the_loopback_example_is_four_members_on_slots_0_to_255() -> None:
    job = JobConfig.load(EXAMPLE_JOB)
    assert job.job_id == 1 and job.slots == (0, 255) and job.lanes == 64
    assert job.mode == Mode.SYNC and job.quorum == 0
    assert [(m.worker, m.ipv4, m.udp_port, m.switch_port) for m in job.members] == [
        (w, "127.0.0.1", 47001 + w, 1) for w in range(4)]


GOOD: dict[str, Any] = {
    "job_id": 2, "lanes": 64, "scale": 1024.0, "mode": "partial", "quorum": 2,
    "slots": {"base": 256, "count": 64},
    "members": [
        {"worker": 0, "ipv4": "10.0.0.1", "mac": "02:00:00:00:00:01", "udp_port": 5000,
         "switch_port": 1},
        {"worker": 5, "ipv4": "10.0.0.2", "mac": "02:00:00:00:00:02", "udp_port": 5000,
         "switch_port": 2},
    ],
}


def test_a_valid_dict_loads() -> None:
    job = JobConfig.from_dict(GOOD)
    assert job.mode == Mode.PARTIAL and job.quorum == 2 and job.slots == (256, 319)
    assert job.member(5).ipv4 == "10.0.0.2"


def _with(path: str, value: Any) -> dict[str, Any]:
    return changed(GOOD, path, value)


@pytest.mark.parametrize(("path", "value", "message"), [
    ("job_id", 0, "job_id = 0 is out of range: use a job id 1..255"),
    ("job_id", 256, "job_id = 256 is out of range"),
    ("job_id", "one", "job_id = 'one' must be an integer"),
    ("job_id", DELETE, "job_id is missing"),
    ("lanes", 32, "lanes = 32: .* set lanes = 64"),
    ("scale", 0, "scale = 0: .* > 0"),
    ("scale", "big", "scale = 'big'"),
    ("mode", "eager", "mode = 'eager': choose one of sync, partial, async"),
    ("quorum", 3, r"quorum = 3 is out of range: use 1..2 \(the number of members\)"),
    ("quorum", 0, "quorum = 0 is out of range"),
    ("quorum", DELETE, "needs quorum = Q with 1 <= Q <= 2"),
    ("slots", DELETE, r"\[slots\] is missing"),
    ("slots.base", -1, "slots.base = -1 is out of range"),
    ("slots.count", 0, "slots.count = 0 is out of range"),
    ("slots.count", 8000, "exceeds the switch's 8192 slots: lower slots.count to at most 7936"),
    ("slots.size", 3, r"\[slots\]: unknown key\(s\) size"),
    ("members", [], "members is missing or empty"),
    ("members.0.worker", 32, r"members\[0\].worker = 32 is out of range: use 0..31"),
    ("members.1.worker", 0, r"members\[1\].worker = 0 is also members\[0\].worker"),
    ("members.0.ipv4", "10.0.0.256", r"members\[0\].ipv4: IPv4 address"),
    ("members.0.mac", "02:00:00:00:01", r"members\[0\].mac = .* six hex bytes"),
    ("members.0.udp_port", 70000, r"members\[0\].udp_port = 70000 is out of range"),
    ("members.0.switch_port", 511, r"members\[0\].switch_port = 511 is out of range: use 0..510"),
    ("members.1", "h2", r"members\[1\] must be a table \(\[\[members\]\]\)"),
    ("members.0.port", 1, r"members\[0\]: unknown key\(s\) port"),
    ("member", [], r"unknown key\(s\) member; allowed keys are"),
])
def test_an_invalid_field_is_named_with_its_fix(path: str, value: Any, message: str) -> None:
    with pytest.raises(JobConfigError, match=message):
        JobConfig.from_dict(_with(path, value))


def test_a_quorum_outside_partial_mode_is_refused() -> None:
    data = _with("mode", "sync")
    with pytest.raises(JobConfigError, match="quorum = 2 is only for mode = \"partial\""):
        JobConfig.from_dict(data)


def test_two_members_on_one_address_or_one_mac_on_two_ports_are_refused() -> None:
    data = _with("members.1.ipv4", "10.0.0.1")
    with pytest.raises(JobConfigError, match="same ipv4:udp_port 10.0.0.1:5000"):
        JobConfig.from_dict(data)
    data = _with("members.1.mac", "02:00:00:00:00:01")
    with pytest.raises(JobConfigError, match="one host, one port"):
        JobConfig.from_dict(data)


def test_file_errors_name_the_file(tmp_path) -> None:
    with pytest.raises(JobConfigError, match="cannot read the job file .*nope.toml"):
        JobConfig.load(tmp_path / "nope.toml")
    bad = tmp_path / "bad.toml"
    bad.write_text("job_id = [")
    with pytest.raises(JobConfigError, match="bad.toml is not valid TOML"):
        JobConfig.load(bad)
    partial = tmp_path / "partial.toml"
    partial.write_text(EXAMPLE_JOB.read_text().replace('mode = "sync"', 'mode = "partial"'))
    with pytest.raises(JobConfigError, match="partial.toml: mode = \"partial\" needs quorum"):
        JobConfig.load(partial)
