"""One conformance suite, every available target (docs/protocol.md is the oracle)."""

from __future__ import annotations

import collections

import pytest

from hysync import wire
from tests.p4tools import skip_unless_available

from .targets import NativeTarget, SoftswitchTarget, bmv2_unavailable, job_group, job_writes
from .tna_model import TnaModelTarget
from .topology import JOB1, JOB2


def make_target(kind: str, num_slots: int = wire.NUM_SLOTS):
    """A fresh target of `kind` with the pipeline loaded and the flood group; BMv2 (one
    process per session, restarted) always has the program's NUM_SLOTS."""
    if kind == "softswitch":
        return SoftswitchTarget(num_slots)
    if kind == "native":
        return NativeTarget(num_slots)
    if kind == "tna-model":
        return TnaModelTarget(num_slots)
    skip_unless_available(bmv2_unavailable())
    from .bmv2_target import Bmv2Target  # only importable where BMv2 runs

    return Bmv2Target.shared()


TARGETS = ("softswitch", "native", "bmv2", "tna-model")
# target -> outcome -> how many conformance cases had it ("is BMv2 really run?" at a glance)
CASES: dict[str, collections.Counter] = {kind: collections.Counter() for kind in TARGETS}


def _target_of(nodeid: str) -> str | None:
    """The target a case ran on: the first part of its parameter id (`test_x[bmv2-sync]`)."""
    params = nodeid.rpartition("[")[2].rstrip("]").split("-")
    for kind in TARGETS:
        if "-".join(params[:len(kind.split("-"))]) == kind:
            return kind
    return None


def pytest_runtest_logreport(report) -> None:
    if "tests/conformance/" not in report.nodeid or (kind := _target_of(report.nodeid)) is None:
        return
    if report.when == "call" or report.outcome != "passed":  # a setup skip or error counts too
        CASES[kind][report.outcome] += 1


def pytest_terminal_summary(terminalreporter) -> None:
    """How many conformance cases, and random sequences of the differential harness, ran on
    each target."""
    from .test_differential import RAN

    ran = [f"{kind} " + " ".join(f"{n} {outcome}" for outcome, n in sorted(CASES[kind].items()))
           for kind in TARGETS if CASES[kind]]
    if ran:
        terminalreporter.write_line(f"conformance cases per target: {', '.join(ran)}")
    if RAN:
        counts = ", ".join(f"{kind} {n}" for kind, n in RAN.items())  # in the order they ran
        terminalreporter.write_line(
            f"differential harness (tests/conformance): random sequences per target: {counts}")


@pytest.fixture(params=list(TARGETS))
def bare_target(request):
    """A target with the pipeline loaded and the flood group, but no job."""
    target = make_target(request.param)
    yield target
    target.close()


def install(target, job=JOB1, mode=wire.Mode.SYNC, quorum=0, active=None) -> None:
    for w in job_writes(job, mode, quorum, active):
        target.write("INSERT", w)
    target.write_group("INSERT", job.job_id, job_group(job, active))


def uninstall(target, job=JOB1, mode=wire.Mode.SYNC, quorum=0, active=None) -> None:
    """Remove what `install` wrote, in reverse order (admission first)."""
    target.write_group("DELETE", job.job_id, [])
    for w in reversed(job_writes(job, mode, quorum, active)):
        target.write("DELETE", w)


@pytest.fixture
def target(bare_target):
    """A target with JOB1 (4 members, slots 0-15, sync) and JOB2 (2 members, slots 16-31)."""
    install(bare_target, JOB1)
    install(bare_target, JOB2)
    return bare_target
