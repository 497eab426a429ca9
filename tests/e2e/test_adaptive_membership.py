"""End to end: a straggler is detected, excluded and readmitted by the
adaptive policy, every gradient is still applied exactly once, and the replicas agree
after the final averaging round.

Real components only: `python -m hysync.softswitch` (P4Runtime gRPC server + UDP data plane)
in a process of its own, the `Controller` installing two jobs (training: 4 members,
16 slots; averaging: the same 4 workers on a second UDP port each and a disjoint slot
range, always sync), four worker processes with a `Transport` per job, and the
`PolicyRunner` + `AdaptivePolicy` stepping in a thread of the test process, with the
policy's time constants scaled down (its thresholds keep their meaning).

Worker 3 computes 10x as long as a whole healthy iteration takes (compute and
communication, as loaded as the machine is; `membership_procs.straggler_pause`) until
the policy excludes it, then at the others' pace (it recovers). Expected, and asserted
from the decision log: the policy finds worker 3 slow, leaves sync, excludes it as a
persistent straggler, readmits it on its NOT_MEMBER heartbeat, it passes probation (and
the policy returns to sync); no healthy worker is ever excluded. Then the training job
is released through async (no partial round stays open), flushed in sync, and the
replicas (every training output summed: the "model") are averaged once on the
averaging job.
"""

from __future__ import annotations

import contextlib
import json
import shutil
import socket
import tempfile
import threading
import time
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import numpy as np
import pytest

from hysync.controlplane.controller import Controller
from hysync.controlplane.job import JobConfig, Member
from hysync.controlplane.p4rt.switch import Switch
from hysync.controlplane.policy.detect import DetectorConfig
from hysync.controlplane.policy.policies import (
    EXCLUDE,
    READMIT,
    SET_MODE,
    AdaptivePolicy,
    PolicyConfig,
)
from hysync.controlplane.policy.runner import PolicyRunner
from hysync.wire import Mode
from hysync.worker.quantize import FixedPointQuantizer
from hysync.worker.transport import Transport, TransportConfig
from tests.e2e.membership_procs import Cluster, Spec, gradient
from tests.softswitch.switch_process import softswitch_process
from tests.worker.relay import Impairment, LossyRelay

pytestmark = pytest.mark.slow

P4INFO = Path(__file__).resolve().parents[2] / "p4src" / "v1model" / "hysync.p4info.txtpb"
N = 4
STRAGGLER = 3
INTERVAL = 0.2  # policy step (default 0.5 s)
DECISION_TIMEOUT = 60.0  # for each expected decision; normally a few seconds


def policy_config() -> PolicyConfig:
    """The defaults' time constants mostly scaled down ~3x (thresholds unchanged:
    exclusion at rho / kappa = 3.0x, detection at 1.3x, ...). gone_after_s stays
    generous: a healthy worker descheduled on a loaded machine must not look dead.

    probation_s and min_dwell_s keep their defaults: a readmitted worker first settles
    its parked packets (retransmitted at rto_max, 0.5 s), which takes it a second or
    more on a loaded machine, and it is then measured over a pace window and adopted
    healthy after dwell_s. Probation must end on a window past that return (a shorter
    one measures the return itself, ~3x, and excludes the recovered worker again), and
    the policy must wait for the detector's verdict before it leaves partial: it waits
    at most 3 x min_dwell_s after the readmission, and past that bound it returns to
    sync on a half-settled detector, still calling the recovered worker slow (~1.1x)."""
    detector = DetectorConfig(window_s=1.0, closes_window_s=1.2, min_evidence_s=0.6,
                              crowd_window_s=3.0, gone_after_s=3.0, dwell_s=0.4)
    return PolicyConfig(min_dwell_s=2.0, probe_s=1.2, probe_ttl_s=8.0, exclude_after_s=1.0,
                        readmit_after_s=1.5, max_excluded_s=8.0, probation_s=3.0,
                        heartbeat_window_s=1.0, max_starved_s=8.0, refresh_s=0.5,
                        detector=detector)


CONFIG = policy_config()


def job(job_id: int, base: int, count: int, addrs: dict[int, tuple[str, int]]) -> JobConfig:
    # One host per worker (the same MAC in both jobs); the UDP data plane ignores ports.
    members = tuple(Member(w, addrs[w][0], f"02:00:00:00:0e:{w + 1:02x}", addrs[w][1], 1)
                    for w in range(N))
    return JobConfig(job_id=job_id, members=members, slot_base=base, slot_count=count,
                     mode=Mode.SYNC)


def per_element(truth: dict[int, np.ndarray], spec: Spec) -> np.ndarray:
    """The relay's per-chunk totals of the training key (chunks 0..) -> one value per element."""
    rows = [truth.get(c, np.zeros(64)) for c in range(-(-spec.size // 64))]
    return np.concatenate(rows)[:spec.size] / spec.scale


@pytest.fixture
def workdir() -> Iterator[Path]:
    path = Path(tempfile.mkdtemp(prefix="e2emem_", dir="/tmp"))
    try:
        yield path
    finally:
        shutil.rmtree(path, ignore_errors=True)


class PolicyThread:
    """runner.run() in a daemon thread; an exception in it fails the test."""

    def __init__(self, runner: PolicyRunner) -> None:
        self.stop = threading.Event()
        self.error: BaseException | None = None
        self.thread = threading.Thread(target=self._run, args=(runner,), daemon=True,
                                       name="e2emem-policy")

    def _run(self, runner: PolicyRunner) -> None:
        try:
            runner.run(stop=self.stop)
        except BaseException as err:  # noqa: BLE001 - re-raised in the test
            self.error = err

    def join(self) -> None:
        self.stop.set()
        self.thread.join(timeout=30)
        assert not self.thread.is_alive(), "the policy thread did not stop"


def describe(records: list[dict[str, Any]]) -> str:
    return "decisions:\n" + "\n".join(
        f"{r['time']:.2f} {r['action']} {r['worker']} {r['mode']}({r['quorum']}): {r['reason']}"
        for r in records)


def wait_for(records: list[dict[str, Any]], what: Callable[[dict[str, Any]], bool],
             cluster: Cluster, policy: PolicyThread, timeout: float,
             name: str, optional: bool = False) -> dict[str, Any] | None:
    """The first decision record that satisfies `what`, waiting at most `timeout` s;
    a worker or the policy runner failing meanwhile fails at once."""
    deadline = time.monotonic() + timeout
    while True:
        found = [r for r in list(records) if what(r)]
        if found:
            return found[0]
        cluster.check()
        if policy.error is not None:
            raise AssertionError(f"the policy runner failed: {policy.error!r}")
        if time.monotonic() > deadline:
            if optional:
                return None
            raise AssertionError(f"no {name} within {timeout:g} s; {describe(records)}")
        time.sleep(0.05)


def test_a_straggler_is_excluded_and_readmitted_and_every_gradient_applied_once(
        workdir: Path) -> None:
    began = time.monotonic()
    log_file = workdir / "policy.jsonl"
    with softswitch_process(workdir / "softswitch.log") as sw_proc, \
            Switch(sw_proc.grpc_addr, connect_timeout=10.0, timeout=20.0) as sw, \
            contextlib.ExitStack() as stack:
        sw.push_pipeline(P4INFO)
        controller = Controller(sw).attach()
        # A relay that loses nothing: it records every result the switch sends.
        relay = LossyRelay(sw_proc.udp_addr, seed=1, up=Impairment(), down=Impairment()).start()
        stack.callback(relay.stop)
        spec = Spec(switch=relay.address, straggler=STRAGGLER)
        train_slots = (spec.train_base, spec.train_base + spec.train_slots - 1)
        with Cluster(spec) as cluster:
            bound = cluster.collect("bound", timeout=120)
            controller.add_job(job(spec.train_job, spec.train_base, spec.train_slots,
                                   {w: relay.add_worker(b["train"]) for w, b in bound.items()}))
            controller.add_job(job(spec.avg_job, spec.avg_base, spec.avg_slots,
                                   {w: relay.add_worker(b["avg"]) for w, b in bound.items()}))
            records: list[dict[str, Any]] = []
            runner = PolicyRunner(controller, spec.train_job, AdaptivePolicy(CONFIG),
                                  interval=INTERVAL, log_path=log_file, echo=records.append)
            runner.start()
            policy = PolicyThread(runner)
            policy.thread.start()
            cluster.events["go"].set()
            go = time.monotonic()
            try:
                excluded = wait_for(records, lambda r: r["action"] == EXCLUDE, cluster, policy,
                                    DECISION_TIMEOUT, "exclusion")
                cluster.events["recover"].set()  # the straggler computes at full pace again
                readmitted = wait_for(
                    records, lambda r: r["action"] == READMIT and r["time"] > excluded["time"],
                    cluster, policy, DECISION_TIMEOUT, "readmission")
                # Probation: it passes (the policy returns to sync once nobody is slow) or
                # is over after at most 3 x probation_s (nothing measurable: passed too).
                settled = wait_for(
                    records, lambda r: r["time"] > readmitted["time"] and (
                        r["action"] == EXCLUDE or r["action"] == SET_MODE and r["mode"] == "sync"),
                    cluster, policy, 3 * CONFIG.probation_s + 3.0, "end of probation",
                    optional=True)
            finally:
                policy.join()
                runner.close()
            startup_s, decided_s = go - began, time.monotonic() - go
            # The policy is stopped: from here on the test drives the job.
            assert controller.job(spec.train_job).active == frozenset(range(N)), describe(records)
            heartbeat = controller.stats(spec.train_job).drops.get("NOT_MEMBER", 0)
            controller.set_mode(spec.train_job, slots=train_slots, mode=Mode.ASYNC)
            cluster.events["stop_train"].set()
            trained = cluster.collect("trained")
            cluster.collect("async")
            cluster.events["stop_serve"].set()
            cluster.collect("served")
            controller.set_mode(spec.train_job, slots=train_slots, mode=Mode.SYNC)
            cluster.events["flush"].set()
            results = cluster.collect("result")
            cluster.events["average"].set()
            averaged = cluster.collect("averaged")
    elapsed = time.monotonic() - began

    # ---------------------------------------------------------- the policy's decisions
    lines = [json.loads(line) for line in log_file.read_text().splitlines()]
    assert lines[0]["action"] == "start" and lines[1:] == records
    decisions = [r for r in lines[1:] if r["job_id"] == spec.train_job]
    assert all(r["applied"] and r["error"] is None for r in decisions), decisions
    story = [(r["action"], r["worker"], r["mode"], r["quorum"], r["reason"]) for r in decisions]
    excludes = [r for r in decisions if r["action"] == EXCLUDE]
    assert {r["worker"] for r in excludes} == {STRAGGLER}, f"a healthy worker was excluded: {story}"
    # Detected before it was excluded: the policy left sync because of worker 3.
    before = [r for r in decisions if r["time"] < excluded["time"]]
    assert any(r["action"] == SET_MODE and f"worker {STRAGGLER} slow" in r["reason"]
               for r in before), story
    # Excluded as a persistent straggler, on its measured slowdown, in partial mode.
    x = CONFIG.exclusion_slowdown
    assert excluded["worker"] == STRAGGLER and excluded["reason"].startswith(
        "persistent straggler"), excluded["reason"]
    seen = excluded["inputs"]["workers"][str(STRAGGLER)]
    assert seen["state"] == "slow" and seen["basis"] == "pace" and seen["slowdown"] >= 0.9 * x
    assert excluded["mode"] == "partial" and STRAGGLER in excluded["inputs"]["excluded"]
    # Readmitted on its heartbeat (NOT_MEMBER drops of its retransmissions); it passed
    # probation (was not excluded again), normally seen as the return to sync.
    assert readmitted["worker"] == STRAGGLER and "heartbeat" in readmitted["reason"]
    assert readmitted["inputs"]["heartbeat"] >= CONFIG.heartbeat_min_rate
    assert heartbeat > 0
    assert not [r for r in excludes if r["time"] > readmitted["time"]], story
    if settled is not None:  # back to sync: every member healthy again
        assert settled["reason"].startswith("no straggler"), settled["reason"]
    # The straggler was slow until the exclusion and recovered after it.
    assert trained[STRAGGLER]["recovered_at"] is not None
    slow_calls = trained[STRAGGLER]["recovered_at"]
    assert 0 < slow_calls < min(trained[w]["calls"] for w in range(N) if w != STRAGGLER)

    # ---------------------------------------------------------- exactly once
    contributed = sum(gradient(spec, w, t).astype(np.float64)
                      for w in range(N) for t in range(trained[w]["calls"]))
    residual = sum(r["residual"] for r in results.values())
    for w, r in results.items():
        assert r["in_flight"] == 0, f"worker {w} still has packets in flight"
        # after the sync flush only quantization errors remain
        assert np.abs(r["residual"]).max() <= 0.5 / spec.scale * 1.001, w
    expected = contributed - residual
    train_range = range(spec.train_base, spec.train_base + spec.train_slots)
    assert np.abs(per_element(relay.ground_truth(train_range), spec) - expected).max() < 1e-4
    applied = per_element(relay.averages(spec.members, train_range), spec)  # each result once
    # The excluded worker missed the results of the rounds run without it: it must say so.
    assert results[STRAGGLER]["needs_resync"], "the excluded replica hid its missed results"
    assert np.abs(results[STRAGGLER]["model"] - applied).max() > 1e-2
    whole = sorted(w for w, r in results.items() if not r["needs_resync"])
    assert whole == [w for w in range(N) if w != STRAGGLER], \
        {w: (r["needs_resync"], r["missed"]) for w, r in results.items()}
    for w in whole:
        np.testing.assert_allclose(results[w]["model"], applied, atol=1e-4, err_msg=f"worker {w}")
    for w in whole[1:]:
        np.testing.assert_allclose(results[w]["model"], results[whole[0]]["model"], atol=1e-4)
    # Rounds ran in every mode: sync, the async probe and release, partial while worker 3
    # was slow, excluded or on probation.
    assert all(results[w].get(f"rounds_{m}", 0) > 0 for w in whole
               for m in ("sync", "partial", "async")), {w: dict(r) for w, r in results.items()}

    # ---------------------------------------------------------- the final averaging round
    models = np.array([results[w]["model"] for w in range(N)])
    assert np.abs(models[STRAGGLER] - models[whole[0]]).max() > 1e-2  # it really diverged
    mean = models.mean(axis=0)
    after = [averaged[w]["model"] for w in range(N)]
    for w in range(1, N):
        np.testing.assert_array_equal(after[w], after[0], err_msg=f"replica {w} differs")
    # quantization (<= 0.5 / scale on the mean) + float32 rounding of input and output
    bound = 0.5 / spec.scale * 1.001 + 2 * np.abs(models).max() * 2.0**-24 + 1e-12
    assert np.abs(after[0] - mean).max() <= bound
    for w, a in averaged.items():
        assert not a["avg_needs_resync"] and a["avg_in_flight"] == 0, w
        chunks = -(-spec.size // 64)
        assert a["avg_modes"] == {"sync": chunks} and a["avg_contributors"] == {N: chunks}, a
        assert not a["train_needs_resync"], w  # cleared: its replica is the average now
    print(f"\nstartup {startup_s:.1f} s, policy {decided_s:.1f} s, total {elapsed:.1f} s; calls "
          f"{[trained[w]['calls'] for w in range(N)]} (straggler slow for {slow_calls}); "
          f"NOT_MEMBER {heartbeat}; decisions: "
          + "; ".join(f"{a} {w if w is not None else ''} {m}({q})" for a, w, m, q, _ in story))


# ------------------------------------------------------------------ heartbeat
def test_an_excluded_worker_keeps_its_heartbeat_between_calls(workdir: Path) -> None:
    """A worker in partial mode is excluded, and keeps calling allreduce with plain
    sleeps in between (no poll_results): its parked packets must keep retransmitting
    (the heartbeat the policy readmits on), and once readmitted it must contribute."""
    job_id, base, slots = 13, 40, 4
    with softswitch_process(workdir / "softswitch.log") as sw_proc, \
            Switch(sw_proc.grpc_addr, connect_timeout=10.0, timeout=20.0) as sw, \
            socket.socket(socket.AF_INET, socket.SOCK_DGRAM) as other:
        sw.push_pipeline(P4INFO)
        controller = Controller(sw).attach()
        other.bind(("127.0.0.1", 0))  # worker 1: a member that never sends
        tr = Transport(TransportConfig(job_id=job_id, worker_id=0, switch_host=sw_proc.udp_addr[0],
                                       switch_port=sw_proc.udp_addr[1], bind_host="127.0.0.1",
                                       slot_base=base, slot_count=slots, members=2,
                                       dead_after=30.0), FixedPointQuantizer(2.0**20, 2))
        try:
            members = tuple(Member(w, "127.0.0.1", f"02:00:00:00:0d:{w + 1:02x}", port, 1)
                            for w, port in ((0, tr.address[1]), (1, other.getsockname()[1])))
            controller.add_job(JobConfig(job_id=job_id, members=members, slot_base=base,
                                         slot_count=slots, mode=Mode.PARTIAL, quorum=1))
            values = np.ones(slots * 64, dtype=np.float32)
            for _ in range(2):  # partial(1): its own contributions close the rounds
                modes = tr.allreduce("g", values).stats.slot_modes
            assert modes == (Mode.PARTIAL,) * slots

            def not_member() -> int:
                return controller.stats(job_id).drops.get("NOT_MEMBER", 0)

            def calls(seconds: float) -> None:
                end = time.monotonic() + seconds
                while time.monotonic() < end:
                    time.sleep(0.05)  # computing
                    tr.allreduce("g", values)

            controller.exclude(job_id, 0)
            calls(0.5)  # its packets meet silence and are parked
            before = not_member()
            calls(1.5)
            heartbeat = not_member() - before
            controller.readmit(job_id, 0)
            counted = controller.stats(job_id).workers[0].contributions
            calls(1.5)
            contributed = controller.stats(job_id).workers[0].contributions - counted
        finally:
            tr.close()
    # rto_max is 0.5 s: each of the parked packets is retransmitted at least every 0.5 s.
    assert heartbeat >= slots, f"excluded worker silent: {heartbeat} NOT_MEMBER drops in 1.5 s"
    assert contributed > 0, "readmitted worker never contributed"
