"""A switch restart mid-training with real processes and sockets (docs/protocol.md §9, "A
switch that lost the job's state"): the native softswitch runs as `python -m
hysync.softswitch`, is killed with SIGKILL while worker threads call all-reduce over UDP,
and is started again on the same ports with the pipeline pushed.

* Job added again by hand (`Controller.add_job`): every call completes with the right
  result or fails with SwitchRestartedError / NoReplyError naming the switch,
  within dead_after; after the re-add (the workers resynchronize: residual dropped), the
  job goes on and its calls complete (bit-exact in sync).
* Job not added again: every worker fails with NoReplyError within dead_after;
  none hangs.
* Job admitted through `hysync serve`: serve's session with the switch ends at the kill;
  serve connects again, pushes the pipeline and installs its job again (new install
  epoch), with nobody running `hysync deploy` or `hysync job add`; the workers go on as
  after a re-add by hand.
"""

from __future__ import annotations

import io
import signal
import socket
import subprocess
import threading
import time
from dataclasses import dataclass, field
from pathlib import Path

import numpy as np
import pytest

from hysync import wire
from hysync.controlplane.cli.main import main as hysync_main
from hysync.controlplane.controller import Controller
from hysync.controlplane.errors import P4RuntimeUnreachableError
from hysync.controlplane.job import JobConfig
from hysync.controlplane.p4rt.switch import Switch, wait_for_server
from hysync.controlplane.serve.client import ServeClient
from hysync.controlplane.serve.server import Server
from hysync.controlplane.tables import admission
from hysync.controlplane.testbed.inventory import Inventory
from hysync.topologies.runner import start_softswitch
from hysync.worker.quantize import FixedPointQuantizer
from hysync.worker.transport import (
    CallAbortedError,
    NoReplyError,
    SwitchRestartedError,
    Transport,
    TransportConfig,
)
from tests.controlplane.conftest import P4INFO, make_job

from .conftest import loopback_inventory, write_inventory

N = 4
JOB = 5
SLOT_BASE, SLOT_COUNT = 16, 8
SIZE = 700  # 11 chunks on 8 slots: a call reuses slots
SCALE = 2.0**16
KEY = "g"
PRE_CALLS = 4  # calls every worker completes before the switch is killed
POST_CALLS = 5  # calls every worker makes after the job was added again
POST = 10_000  # values(w, POST + j): the j-th call after the resynchronization
DEAD_AFTER = 8.0  # longer than a restart of the switch process on a loaded machine
DEAD_AFTER_BARE = 2.0  # no re-add: only the failure is awaited
RTO_MAX = 0.5
MARGIN = 4.0  # a loaded machine: threads and processes wait for a core
WAIT = 90.0  # for an event the test waits on: a hang fails, a slow machine does not

MODES = [("sync", None), ("partial", N - 1), ("async", None)]
MODE_IDS = ["sync", "partial-quorum3", "async"]


# ------------------------------------------------------------------ the switch process
class SwitchProcess:
    """`python -m hysync.softswitch` (native engine) on loopback: first on the ports it
    binds itself (port 0, printed), then, killed and started again, on those same ports,
    where the workers and the controller expect it."""

    def __init__(self, log: Path) -> None:
        self.grpc_addr = "127.0.0.1:0"
        self.udp = ("127.0.0.1", 0)
        self.log = log
        self.proc: subprocess.Popen | None = None

    def start(self) -> None:
        self.proc, self.grpc_addr, port = start_softswitch(
            self.log, "--threads", "1", "--log-level", "warning", grpc_addr=self.grpc_addr,
            udp=f"{self.udp[0]}:{self.udp[1]}")
        self.udp = (self.udp[0], port)
        proc = self.proc
        wait_for_server(self.grpc_addr, WAIT, failed=lambda: None if proc.poll() is None else
                        f"the softswitch exited ({proc.returncode}); see {self.log}")

    def kill(self) -> None:
        assert self.proc is not None
        self.proc.send_signal(signal.SIGKILL)
        self.proc.wait(timeout=WAIT)

    def stop(self) -> None:
        if self.proc is not None and self.proc.poll() is None:
            self.kill()


def add_by_hand(sw: SwitchProcess, job: JobConfig | None, *, after: int | None = None,
                epoch: int | None = None) -> int | None:
    """Push the pipeline, and add `job` (None: the pipeline only); returns its install epoch.
    `after`: the epoch of the install the switch lost. The new one gets another install tag,
    as serve gives it (admission.new_epoch); a controller with no record of the old one
    meets its tag again 1 time in 256 (docs/protocol.md §9), which `epoch` forces."""
    with Switch(sw.grpc_addr) as session:
        session.push_pipeline(P4INFO)
        if job is None:
            return None
        controller = Controller(session).attach()
        if epoch is None and after is not None:
            epoch = admission.new_epoch(after)
        controller.add_job(job, epoch=epoch)
        return controller.jobs[job.job_id].epoch


# ------------------------------------------------------------------ the workers
def values(worker: int, call: int) -> np.ndarray:
    """Integers: exact in fixed point at a power-of-two scale, and so is their mean over N
    workers (a multiple of 1/4)."""
    return ((np.arange(SIZE) * (worker + 3) + 7 * call + worker) % 97 - 48).astype(np.float32)


def mean_of(call: int) -> np.ndarray:
    return (sum(values(w, call).astype(np.float64) for w in range(N)) / N).astype(np.float32)


@dataclass
class Call:
    index: int  # which values(): 0, 1, ... before the restart; 0 ... POST_CALLS - 1 after
    post: bool  # made after the replica was resynchronized (the job added again)
    start: float
    end: float
    output: np.ndarray | None = None
    error: BaseException | None = None
    counts: tuple[int, ...] = ()  # contributors of each result applied
    duplicates: int = 0  # results dropped as already applied
    needs_resync: bool = False  # the replica was flagged at the call's end
    relearn: bool = False  # the first call after the re-add of a worker that had timed out


@dataclass
class Worker:
    w: int
    tr: Transport
    calls: list[Call] = field(default_factory=list)
    flagged: bool = False  # needed a resync after the restart
    crashed: BaseException | None = None


class Training:
    """N worker threads, each with its own Transport (GIL released during a call)."""

    def __init__(self, switch_udp: tuple[str, int], sockets: list[socket.socket],
                 dead_after: float, readd: bool, job_id: int = JOB,
                 slot_base: int = SLOT_BASE, slot_count: int = SLOT_COUNT) -> None:
        self.readd = readd
        ports = member_ports(sockets)
        self.workers = [
            Worker(w, Transport(TransportConfig(
                job_id=job_id, worker_id=w, switch_host=switch_udp[0],
                switch_port=switch_udp[1], bind_host="127.0.0.1", bind_port=ports[w],
                bind_fd=sockets[w].detach(),
                slot_base=slot_base, slot_count=slot_count, members=N, rto_max=RTO_MAX,
                dead_after=dead_after, seed=w), FixedPointQuantizer(SCALE, N)))
            for w in range(N)]
        self.cond = threading.Condition()
        self.resumed = threading.Event()  # the job is installed again
        self.threads = [threading.Thread(target=self._run, args=(wk,), daemon=True)
                        for wk in self.workers]

    def start(self) -> Training:
        for t in self.threads:
            t.start()
        return self

    def close(self) -> None:
        self.resumed.set()
        for t in self.threads:
            t.join(timeout=WAIT)
        for wk in self.workers:
            wk.tr.close()

    def _call(self, wk: Worker, index: int, post: bool = False) -> Call:
        call = Call(index, post, time.monotonic(), 0.0)
        try:
            result = wk.tr.allreduce(KEY, values(wk.w, POST + index if post else index))
            call.output = result.output
            call.counts = tuple(int(c) for c in result.stats.results["count"])
            call.duplicates = result.stats.duplicate_results
            call.needs_resync = result.stats.needs_resync
        except CallAbortedError as err:  # NoReplyError or SwitchRestartedError
            call.error = err
        call.end = time.monotonic()
        with self.cond:
            wk.calls.append(call)
            self.cond.notify_all()
        return call

    def _run(self, wk: Worker) -> None:
        try:
            index = 0
            # Until a call fails (the switch is gone), or one that started after the job was
            # added again completed (an async job is not told of the restart, see
            # docs/protocol.md §9).
            while True:
                resumed = self.resumed.is_set()
                call = self._call(wk, index)
                index += 1
                if call.error is not None:
                    break
                if resumed and self.readd:
                    break
                if index > 100_000:
                    raise AssertionError("no call failed: was the switch killed?")
            if not self.readd:
                # One more call: it fails too, within dead_after (nothing comes back).
                self._call(wk, index)
                return
            if not self.resumed.wait(WAIT):
                raise AssertionError("the job was not added again")
            # The replica is resynchronized (as a training script restores it): the aborted
            # call's contributions, kept as residual, are dropped with it. A partial-mode
            # worker may learn of the new state between calls (its parked packets' STALE
            # replies): no call fails, the replica is flagged.
            wk.flagged = wk.tr.needs_resync
            wk.tr.residual(KEY)[:] = 0
            wk.tr.clear_resync()
            timed_out = type(call.error) is NoReplyError
            j = 0
            while j < POST_CALLS:
                call = self._call(wk, j, post=True)
                if j == 0 and timed_out and isinstance(call.error, SwitchRestartedError):
                    # It gave up before the job was back (a restart slower than dead_after),
                    # so it learns the new state now, at once: resynchronize, call again.
                    call.relearn, timed_out = True, False
                    wk.tr.residual(KEY)[:] = 0
                    wk.tr.clear_resync()
                    continue
                j += 1
        except BaseException as err:  # reported by the test
            wk.crashed = err
            with self.cond:
                self.cond.notify_all()

    def wait_calls(self, count: int) -> None:
        """Until every worker completed `count` calls (or one failed early)."""
        with self.cond:
            ok = self.cond.wait_for(lambda: all(
                wk.crashed or any(c.error for c in wk.calls) or len(wk.calls) >= count
                for wk in self.workers), WAIT)
        assert ok, "workers did not progress"
        for wk in self.workers:
            assert wk.crashed is None, wk.crashed
            assert len(wk.calls) >= count and not any(c.error for c in wk.calls[:count]), \
                (wk.w, [c.error for c in wk.calls])

    def wait_failed(self) -> None:
        """Until every worker's call failed (the switch is gone)."""
        with self.cond:
            ok = self.cond.wait_for(lambda: all(
                wk.crashed or any(c.error for c in wk.calls) for wk in self.workers), WAIT)
        assert ok, "a worker hangs: no call failed"

    def join(self) -> None:
        for t in self.threads:
            t.join(timeout=WAIT)
            assert not t.is_alive(), "a worker hangs"
        for wk in self.workers:
            assert wk.crashed is None, f"worker {wk.w}: {wk.crashed!r}"


# ------------------------------------------------------------------ the checks
def check_error(call: Call, switch_udp: tuple[str, int], dead_after: float,
                job_id: int = JOB) -> None:
    err = call.error
    assert isinstance(err, CallAbortedError), err
    text = str(err)
    assert f"{switch_udp[0]}:{switch_udp[1]}" in text, text  # it names the switch
    if isinstance(err, SwitchRestartedError):
        assert "restarted" in text and f"job {job_id}" in text, text
    else:
        assert f"for {dead_after:g} s" in text, text
    # A call fails within dead_after of the last reply it heard (its start at the latest).
    assert call.end - call.start <= dead_after + RTO_MAX + MARGIN, (call.end - call.start, text)


def check_completed(call: Call, mode: str, quorum: int | None) -> None:
    assert call.output is not None
    assert np.all(np.isfinite(call.output))
    if mode == "sync":
        # Every worker's contribution, exactly once: the mean, bit for bit.
        assert np.array_equal(call.output, mean_of(POST + call.index if call.post
                                                   else call.index)), call
        assert call.counts and set(call.counts) == {N}, call.counts
    elif mode == "partial":
        assert quorum is not None
        assert all(quorum <= c <= N for c in call.counts), call.counts


def check_run(training: Training, mode: str, quorum: int | None, switch_udp: tuple[str, int],
              dead_after: float, killed_at: float, readded_at: float | None,
              job_id: int = JOB, same_tag: bool = False) -> dict[str, int]:
    """Every call completed correctly or failed with a clear error within its bound;
    returns how many calls failed with which error. `same_tag`: the job was added again
    with the install tag of the state lost (docs/protocol.md §9): a sync worker may flag a
    resync it did not need."""
    errors: dict[str, int] = {}
    for wk in training.workers:
        first_error = next((i for i, c in enumerate(wk.calls) if c.error is not None),
                           len(wk.calls))
        for call in wk.calls[:first_error]:
            check_completed(call, mode, quorum)
        failed = [c for c in wk.calls if c.error is not None]
        for call in failed:
            check_error(call, switch_udp, dead_after, job_id)
            errors[type(call.error).__name__] = errors.get(type(call.error).__name__, 0) + 1
            # Nothing fails before the switch was killed.
            assert call.end >= killed_at, (wk.w, call)
        if readded_at is None:
            # The first failure within dead_after of the kill (the dead timer counts from
            # the first packet left unanswered). The next call gets dead_after afresh: it
            # fails too, or in partial mode it may end by carrying its chunks, with nothing
            # aggregated.
            for c in wk.calls[first_error:]:
                assert c.error is not None or (mode == "partial" and c.counts == ()
                                               and not c.output.any()), (wk.w, c)
            assert wk.calls[first_error].end <= killed_at + dead_after + RTO_MAX + MARGIN
            continue
        # Added again: the job goes on, every later call completes correctly.
        post = [c for c in wk.calls if c.post and not c.relearn]
        assert [c.index for c in post] == list(range(POST_CALLS)), wk.w
        for call in post:
            assert call.error is None, (wk.w, call.index, call.error)
            check_completed(call, mode, quorum)
        assert not wk.tr.needs_resync or mode != "sync" or same_tag, wk.w
        if mode == "async":
            # Async rounds hold one contribution and arrive once each: before the restart
            # no result is a duplicate. After it, a replica that drops results of the new
            # state's rounds as duplicates of the old state's loses others' gradients, and
            # must at least be flagged for a resync.
            assert sum(c.duplicates for c in wk.calls[:PRE_CALLS]) == 0, wk.w
            dropped = sum(c.duplicates for c in post)
            assert dropped == 0 or wk.tr.needs_resync, (
                f"worker {wk.w} dropped {dropped} results of the restarted switch as "
                f"duplicates and is not flagged for a resync")
    return errors


# ------------------------------------------------------------------ the tests
@pytest.fixture
def switch_process(tmp_path: Path):
    sw = SwitchProcess(tmp_path / "softswitch.log")
    sw.start()
    try:
        yield sw
    finally:
        sw.stop()


def member_sockets() -> list[socket.socket]:
    """The members' UDP sockets, bound to ports the kernel chose before the job names them
    (each worker's transport takes its socket over)."""
    sockets = [socket.socket(socket.AF_INET, socket.SOCK_DGRAM) for _ in range(N)]
    for s in sockets:
        s.bind(("127.0.0.1", 0))
    return sockets


def member_ports(sockets: list[socket.socket]) -> list[int]:
    return [s.getsockname()[1] for s in sockets]


CASES = [pytest.param(mode, quorum, readd, id=f"{mode_id}-{readd_id}")
         for (mode, quorum), mode_id in zip(MODES, MODE_IDS, strict=True)
         for readd, readd_id in ((True, "job-added-again"), (False, "not-added-again"))]


@pytest.mark.parametrize(("mode", "quorum", "readd"), CASES)
def test_switch_restart_mid_training(switch_process: SwitchProcess, mode: str,
                                     quorum: int | None, readd: bool) -> None:
    sw = switch_process
    sockets = member_sockets()
    job = make_job(JOB, workers=N, base=SLOT_BASE, count=SLOT_COUNT,
                   ports=member_ports(sockets), mode=mode, quorum=quorum)
    first = add_by_hand(sw, job)
    dead_after = DEAD_AFTER if readd else DEAD_AFTER_BARE
    training = Training(sw.udp, sockets, dead_after, readd).start()
    try:
        training.wait_calls(PRE_CALLS)
        killed_at = time.monotonic()
        sw.kill()
        sw.start()
        add_by_hand(sw, job if readd else None, after=first)
        readded_at = time.monotonic() if readd else None
        if readd:
            training.resumed.set()
        training.join()
        errors = check_run(training, mode, quorum, sw.udp, dead_after, killed_at, readded_at)
    finally:
        training.close()
    # Each worker learned that the switch lost the job's state: a call failed, or (between
    # calls) its replica was flagged for a resync, before the resynchronization or in a
    # later call. In every mode: the results of the new state carry another install tag.
    untold = [wk.w for wk in training.workers
              if not (wk.flagged or any(c.error or c.needs_resync for c in wk.calls))]
    assert not untold, f"workers {untold} were not told that the switch lost the job's state"
    assert errors or (readd and mode in ("async", "partial")), "no call failed"
    if not readd:
        assert set(errors) == {"NoReplyError"}, errors
    elif mode == "sync" and readded_at - killed_at < dead_after - MARGIN:
        # Added again well within dead_after: the workers learn that the switch's state is
        # new from its STALE replies, not from silence.
        assert "SwitchRestartedError" in errors, errors


@pytest.mark.parametrize("same_tag", [False, True], ids=["another-tag", "same-tag"])
def test_job_added_again_after_the_workers_gave_up(switch_process: SwitchProcess,
                                                   same_tag: bool) -> None:
    """Sync, the job added again only after every worker's call failed (a restart slower
    than dead_after): each worker's next call learns the new state at once
    (SwitchRestartedError), and after a resync the job goes on, bit-exact. Also when the new
    install carries the lost one's tag: the STALE replies alone tell the new state."""
    sw = switch_process
    sockets = member_sockets()
    job = make_job(JOB, workers=N, base=SLOT_BASE, count=SLOT_COUNT,
                   ports=member_ports(sockets))
    first = add_by_hand(sw, job)
    assert first is not None
    # Another epoch with the same low byte, the install tag that replies carry.
    same = first + 256 if first + 256 <= wire.MAX_EPOCH else first - 256
    training = Training(sw.udp, sockets, DEAD_AFTER_BARE, readd=True).start()
    try:
        training.wait_calls(PRE_CALLS)
        killed_at = time.monotonic()
        sw.kill()
        training.wait_failed()
        sw.start()
        second = add_by_hand(sw, job, after=first, epoch=same if same_tag else None)
        assert second is not None and second != first
        assert (wire.install_tag(second) == wire.install_tag(first)) == same_tag
        readded_at = time.monotonic()
        training.resumed.set()
        training.join()
        errors = check_run(training, "sync", None, sw.udp, DEAD_AFTER_BARE, killed_at,
                           readded_at, same_tag=same_tag)
    finally:
        training.close()
    assert errors.get("NoReplyError", 0) >= N, errors
    for wk in training.workers:
        relearned = [c for c in wk.calls if c.relearn]
        assert len(relearned) == 1 and relearned[0].end - relearned[0].start < MARGIN, wk.w


def _hysync(*args: str) -> tuple[int, str]:
    out, err = io.StringIO(), io.StringIO()
    code = hysync_main(list(args), stdout=out, stderr=err)
    return code, out.getvalue() + err.getvalue()


@pytest.mark.parametrize(("mode", "quorum"), MODES, ids=MODE_IDS)
def test_serve_installs_its_job_again_after_a_switch_restart(
        switch_process: SwitchProcess, tmp_path: Path, mode: str, quorum: int | None) -> None:
    """A job admitted through `hysync serve`, the switch killed and started bare (no
    pipeline): serve connects again, pushes the pipeline and the forwarding, installs the
    job again as it was (same slots and members, a new install epoch), and the workers go
    on; nobody runs `hysync deploy` or `hysync job add`."""
    sw = switch_process
    data = loopback_inventory(sw.grpc_addr, sw.udp[1], f"unix:{tmp_path / 'serve.sock'}",
                              hosts=N)
    path = write_inventory(tmp_path / "testbed.toml", data)
    code, text = _hysync("deploy", str(path))
    assert code == 0, text
    said: list[str] = []
    back = threading.Event()

    def say(line: str) -> None:
        said.append(line)
        if "is back" in line:
            back.set()

    server = Server(Inventory.load(path), policy=None, policy_interval=0.2, say=say).start()
    client = ServeClient(server.address)
    training: Training | None = None
    try:
        sockets = member_sockets()
        ports = member_ports(sockets)
        reply = client.request({"op": "admit", "mode": mode, "quorum": quorum, "members": [
            {"worker": w, "host": f"h{w + 1}", "udp_port": ports[w]} for w in range(N)]})
        (job,) = reply["jobs"]
        with Switch(sw.grpc_addr, arbitrate=False) as session:
            (before,) = Controller(session).list_jobs()
        training = Training(sw.udp, sockets, DEAD_AFTER, readd=True,
                            job_id=job["job_id"], slot_base=job["slot_base"],
                            slot_count=job["slot_count"]).start()
        training.wait_calls(PRE_CALLS)
        killed_at = time.monotonic()
        sw.kill()
        sw.start()
        assert back.wait(WAIT), f"serve did not connect again: {said}"
        readded_at = time.monotonic()
        training.resumed.set()
        training.join()
        with Switch(sw.grpc_addr, arbitrate=False) as session:
            (after,) = Controller(session).list_jobs()
        errors = check_run(training, mode, quorum, sw.udp, DEAD_AFTER, killed_at, readded_at,
                           job["job_id"])
    finally:
        if training is not None:
            training.close()
        client.close()
        server.close()
    # The same job, installed again: a new epoch, nothing else changed.
    assert after.epoch != before.epoch
    assert (after.slots, after.members, after.active, after.modes) == \
        (before.slots, before.members, before.active, before.modes)
    assert any("is back" in line and f"jobs {job['job_id']} installed again" in line
               for line in said), said
    if mode == "sync":
        assert "SwitchRestartedError" in errors or "NoReplyError" in errors, errors


def test_a_session_outlived_by_its_switch_refuses_every_call(
        switch_process: SwitchProcess) -> None:
    """A primary session whose switch restarted raises on every call, though its channel
    would reach the new switch: what it read and wrote belongs to the old one."""
    sw = switch_process
    add_by_hand(sw, make_job(JOB, workers=N, base=SLOT_BASE, count=SLOT_COUNT))
    with Switch(sw.grpc_addr) as session:
        assert Controller(session).list_jobs()
        sw.kill()
        sw.start()
        deadline = time.monotonic() + WAIT
        while not session.lost and time.monotonic() < deadline:
            time.sleep(0.05)
        assert session.lost
        for call in (lambda: Controller(session).list_jobs(), session.fetch_schema,
                     lambda: session.write([]), lambda: session.push_pipeline(P4INFO)):
            with pytest.raises(P4RuntimeUnreachableError, match="session ended"):
                call()
