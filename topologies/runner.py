"""Runs training configurations of a scenario on a switch, and reports on them.

A *harness* says where things run: `LocalHarness` (the demo: processes on this
machine, softswitch on UDP loopback, no root), `hysync.topologies.mininet_harness`
(Mininet hosts behind a softswitch or BMv2 switch) or `hysync.topologies.fabric_harness`
(racks of hosts behind leaves and a spine). The run itself is the same: push the
pipeline, add the job through the harness's control (`SwitchJobs` on one switch,
`fabric_jobs.FabricJobs` across switches), start the workers, follow their progress,
swap modes on the scenario's schedule or step the adaptive policy (one per level across
switches), collect the logs.
"""

from __future__ import annotations

import contextlib
import json
import os
import queue
import re
import socket
import subprocess
import sys
import threading
import time
from collections.abc import Callable, Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Protocol

from hysync import resources
from hysync.controlplane.controller import Controller
from hysync.controlplane.job import JobConfig, Member
from hysync.controlplane.p4rt.switch import Switch, wait_for_server
from hysync.controlplane.policy.policies import Decision, PolicyConfig, make_policy
from hysync.controlplane.policy.runner import PolicyRunner
from hysync.topologies.children import Children
from hysync.topologies.progress import Display, QuietDisplay, RunLine, RunState
from hysync.topologies.scenario import Scenario
from hysync.wire import Mode

# The checkout's root in an editable install (the benches' files are there); processes
# start in it. Shipped files are found through hysync.resources, never through it.
REPO = Path(__file__).resolve().parents[1]
P4INFO = resources.path(resources.V1MODEL_P4INFO)
JOB_ID = 1
# Slots of the job: contributions in flight per worker (a harness may lower it). Enough
# for a whole step of the CNN scenario (1,847 chunks): each slot then carries one round a
# step, so a sync round waits for a straggler once a step and its closes show who that is
# (docs/performance.md); with fewer slots than chunks, every slot runs several rounds a step
# and the later ones are paced by the network, whoever computes slowest.
WINDOW = 2048
# The model-averaging job (worker/averaging.py): always sync, on slots of its own after the
# training job's, each worker on a second UDP port. 64 slots: a 57-chunk model per round.
AVG_JOB_ID = 2
AVG_SLOTS = 64
AVERAGE_EVERY_S = 1.0  # between background model-averaging rounds
POLICIES = ("sync", "partial", "async", "manual-schedule", "adaptive")
# The adaptive policy's clock for these runs: its defaults (made for jobs that train for
# hours) at half the time constants, read every 0.25 s - the runs last a minute or less.
POLICY_INTERVAL_S = 0.25
POLICY_TIME_SCALE = 0.5


class RunFailed(RuntimeError):
    """A worker of a run failed; the message carries each failed worker's reason."""


@dataclass(frozen=True)
class RunConfig:
    """One configuration of a comparison: a backend and, for HySync, a mode policy."""

    name: str
    backend: str  # hysync | gloo
    policy: str = "sync"  # sync | partial | async | manual-schedule | adaptive
    quorum: int = 0  # partial


class Policies(Protocol):
    """The adaptive policy of a run's training job: one, or one per level across switches."""

    def step(self) -> list[tuple[str, Decision]]: ...  # (level, decision); level "": one switch
    def close(self) -> None: ...


class JobControl(Protocol):
    """What a run asks of the control plane, members named by their worker index (rank)."""

    def add_job(self, job: JobConfig) -> None: ...
    def remove_job(self, job_id: int) -> None: ...
    def set_mode(self, job_id: int, *, slots: tuple[int, int], mode: Mode,
                 quorum: int | None, level: str = "") -> None: ...
    def active(self, job_id: int) -> set[int]: ...
    # Where it was excluded ("": its one switch), None where it stays (its job's last
    # active member, or already out).
    def exclude(self, job_id: int, worker: int) -> str | None: ...
    def readmit(self, job_id: int, worker: int) -> None: ...
    def policy(self, job_id: int, log_path: Path) -> Policies: ...


class Harness(Protocol):
    grpc_addr: str
    device_config: Path | None
    window: int  # the job's slot count: what the switch can take in flight without loss
    leaves: tuple[str, ...]  # across switches: the leaf of each worker; () on one switch

    def members(self, workers: int, *, averaging: bool = False) -> list[Member]: ...
    def bind_argv(self, flag: str, member: Member) -> list[str]: ...
    def switch_argv(self, worker: int) -> list[str]: ...  # where the worker sends, as who
    def rendezvous(self) -> str: ...
    def start_worker(self, worker: int, argv: list[str]) -> subprocess.Popen: ...
    def control(self) -> contextlib.AbstractContextManager[JobControl]: ...


# The line the softswitch prints once it listens: where its P4Runtime server and UDP data
# plane are bound (softswitch/__main__.py).
_LISTENING = re.compile(r"softswitch: P4Runtime on (\S+):(\d+) .*data plane UDP (\S+):(\d+) ")


def start_softswitch(log: Path, *args: str,
                     start: Callable[..., subprocess.Popen] = subprocess.Popen,
                     grpc_addr: str = "127.0.0.1:0", udp: str = "127.0.0.1:0",
                     timeout: float = 300.0) -> tuple[subprocess.Popen, str, int]:
    """A softswitch process on loopback, its output appended to `log`: (the process, its
    P4Runtime address, its UDP data port). Both ports are 0 unless given (a restart where
    the first one was): it binds whatever is free and prints what it bound, so no other
    process can take a port between its choice and its use. `timeout` only bounds a
    switch that neither listens nor exits."""
    seen = log.stat().st_size if log.exists() else 0  # what earlier runs wrote there
    with open(log, "a") as out:
        proc = start([sys.executable, "-m", "hysync.softswitch", "--grpc-addr", grpc_addr,
                      "--udp", udp, *args], stdout=out, stderr=subprocess.STDOUT, cwd=REPO)
    deadline = time.monotonic() + timeout
    while (found := _LISTENING.search(log.read_bytes()[seen:].decode(errors="replace"))) is None:
        if proc.poll() is not None:
            raise RuntimeError(f"the softswitch exited with status {proc.returncode} before "
                               f"it listened; see {log}")
        if time.monotonic() > deadline:
            proc.kill()
            raise RuntimeError(f"the softswitch did not listen within {timeout:g} s; see {log}")
        time.sleep(0.05)
    return proc, f"{found[1]}:{found[2]}", int(found[4])


class LocalHarness:
    """The embedded default: softswitch on UDP loopback, workers as local processes."""

    leaves: tuple[str, ...] = ()

    def __init__(self, log_dir: Path) -> None:
        self.device_config = None
        self.window = WINDOW
        self._ports: dict[bool, list[int]] = {}
        # The members' UDP sockets, bound here and held for the harness's life: each worker
        # inherits its own, so no other process can take a port between its choice and use.
        self._reserved: dict[int, socket.socket] = {}
        # The gloo rendezvous of the current configuration: a listening socket worker 0's
        # TCP store inherits (the same reason).
        self._rendezvous: socket.socket | None = None
        self.log = log_dir / "softswitch.log"
        log_dir.mkdir(parents=True, exist_ok=True)
        self.children = Children()  # the switch and the workers: none outlives the harness
        self.switch, self.grpc_addr, self.data_port = start_softswitch(
            self.log, start=self.children.start)

    def members(self, workers: int, *, averaging: bool = False) -> list[Member]:
        # Ports picked free once per harness (and job), so that runs side by side on one
        # machine do not collide; the same ports for every configuration of the harness.
        if averaging not in self._ports:
            self._ports[averaging] = [self._reserve() for _ in range(workers)]
        ports = self._ports[averaging]
        return [Member(worker=w, ipv4="127.0.0.1", mac=f"02:00:00:00:01:{w + 1:02x}",
                       udp_port=ports[w], switch_port=1) for w in range(workers)]

    def _reserve(self) -> int:
        sock = socket.socket(socket.AF_INET, socket.SOCK_DGRAM)
        sock.bind(("127.0.0.1", 0))
        sock.setblocking(False)
        port = sock.getsockname()[1]
        self._reserved[port] = sock
        return port

    def bind_argv(self, flag: str, member: Member) -> list[str]:
        sock = self._reserved[member.udp_port]
        # What a previous configuration's worker left unread is not this one's to read.
        while True:
            try:
                sock.recv(65536)
            except BlockingIOError:
                break
        return [flag, f"{member.ipv4}:{member.udp_port}", f"{flag}-fd", str(sock.fileno())]

    def switch_data_addr(self) -> str:
        return f"127.0.0.1:{self.data_port}"

    def switch_argv(self, worker: int) -> list[str]:
        return ["--switch", self.switch_data_addr()]

    def control(self) -> contextlib.AbstractContextManager[SwitchJobs]:
        return switch_control(self)

    def rendezvous(self) -> str:
        if self._rendezvous is not None:  # the previous configuration's workers are done
            self._rendezvous.close()
        self._rendezvous = socket.create_server(("127.0.0.1", 0), backlog=128)
        return f"127.0.0.1:{self._rendezvous.getsockname()[1]}"

    def start_worker(self, worker: int, argv: list[str]) -> subprocess.Popen:
        env = dict(os.environ, GLOO_SOCKET_IFNAME="lo")
        # Every reserved socket goes along (a worker uses the two its argv names), and
        # worker 0, which serves the rendezvous, its listening socket.
        fds = [s.fileno() for s in self._reserved.values()]
        if worker == 0 and self._rendezvous is not None:
            argv = [*argv, "--rendezvous-fd", str(self._rendezvous.fileno())]
            fds.append(self._rendezvous.fileno())
        return self.children.start([sys.executable, *argv], stdout=subprocess.PIPE, text=True,
                                   cwd=REPO, env=env, pass_fds=fds)

    def close(self) -> None:
        self.children.close()
        for sock in self._reserved.values():
            sock.close()
        if self._rendezvous is not None:
            self._rendezvous.close()


def connect(harness: Harness, timeout: float = 30.0) -> Switch:
    """A primary P4Runtime session with the harness's switch, pipeline pushed."""
    wait_for_server(harness.grpc_addr, timeout)
    switch = Switch(harness.grpc_addr, connect_timeout=5.0)
    switch.push_pipeline(P4INFO, harness.device_config)
    return switch


class _OneLevel:
    """The policy of a job on one switch, as `Policies`."""

    def __init__(self, runner: PolicyRunner) -> None:
        self.runner = runner

    def step(self) -> list[tuple[str, Decision]]:
        return [("", d) for d in self.runner.step()]

    def close(self) -> None:
        self.runner.close()


class SwitchJobs:
    """The run's jobs on one switch, through its controller (`JobControl`)."""

    def __init__(self, controller: Controller) -> None:
        self.controller = controller

    def add_job(self, job: JobConfig) -> None:
        self.controller.add_job(job)

    def remove_job(self, job_id: int) -> None:
        self.controller.remove_job(job_id)

    def set_mode(self, job_id: int, *, slots: tuple[int, int], mode: Mode,
                 quorum: int | None, level: str = "") -> None:
        self.controller.set_mode(job_id, slots=slots, mode=mode, quorum=quorum)

    def active(self, job_id: int) -> set[int]:
        return set(self.controller.job(job_id).active)

    def exclude(self, job_id: int, worker: int) -> str | None:
        active = self.controller.job(job_id).active
        if worker not in active or len(active) == 1:
            return None
        self.controller.exclude(job_id, worker)
        return ""

    def readmit(self, job_id: int, worker: int) -> None:
        self.controller.readmit(job_id, worker)

    def policy(self, job_id: int, log_path: Path) -> Policies:
        return _OneLevel(PolicyRunner(
            self.controller, job_id,
            make_policy("adaptive", PolicyConfig().scaled(POLICY_TIME_SCALE)),
            interval=POLICY_INTERVAL_S, log_path=log_path))


@contextlib.contextmanager
def switch_control(harness: Harness) -> Iterator[SwitchJobs]:
    """The control of a one-switch harness: a session with its switch, pipeline pushed."""
    with connect(harness) as switch:
        yield SwitchJobs(Controller(switch).attach())


def job_for(harness: Harness, scenario: Scenario, config: RunConfig,
            slot_base: int = 0) -> JobConfig:
    members = tuple(harness.members(scenario.workers))
    mode = {"partial": Mode.PARTIAL, "async": Mode.ASYNC}.get(config.policy, Mode.SYNC)
    return JobConfig(job_id=JOB_ID, members=members, slot_base=slot_base,
                     slot_count=harness.window,
                     mode=mode, quorum=config.quorum if mode == Mode.PARTIAL else 0,
                     name=config.name, leaves=harness.leaves)


def averaging_job_for(harness: Harness, scenario: Scenario, slot_base: int = 0) -> JobConfig:
    """The model-averaging job: the same members on their second port, in sync."""
    members = tuple(harness.members(scenario.workers, averaging=True))
    return JobConfig(job_id=AVG_JOB_ID, members=members, slot_base=slot_base + harness.window,
                     slot_count=AVG_SLOTS, mode=Mode.SYNC, quorum=0, name="model-averaging",
                     leaves=harness.leaves)


@dataclass
class Swap:
    """A change the controller made during a run: a mode swap or a membership change."""

    at_step: int  # worker 0's step when it was made
    t: float
    mode: str
    quorum: int
    action: str = "set_mode"  # set_mode | exclude | readmit
    worker: int | None = None
    reason: str = ""
    level: str = ""  # across switches: spine, leaf or leaf:NAME; "": every level


def run_configs(harness: Harness, scenario: Scenario, configs: list[RunConfig], out_dir: Path,
                display: Display | None = None) -> tuple[dict[str, list[dict]],
                                                        dict[str, list[Swap]]]:
    """Each configuration trained to the end, one after the other, on the harness's switch:
    the workers' logs and the swaps made, by configuration name."""
    with harness.control() as control:
        runs, swaps = {}, {}
        for config in configs:
            runs[config.name], swaps[config.name] = run_config(
                harness, control, scenario, config, out_dir, display)
    return runs, swaps


def run_config(harness: Harness, controller: Controller | JobControl, scenario: Scenario,
               config: RunConfig, out_dir: Path, display: Display | None = None, seed: int = 0,
               ) -> tuple[list[dict], list[Swap]]:
    """Train one configuration to the end, its progress on a line of `display`; return the
    workers' logs and the swaps made. `controller`: the one switch's, or the harness's
    control. `seed`: the model's initialization, the data split and the batches
    (workload.py)."""
    control = SwitchJobs(controller) if isinstance(controller, Controller) else controller
    jobs: list[JobConfig] = []
    if config.backend == "hysync":
        # Every run reuses slots 0..: a new install's epoch starts them afresh.
        jobs = [job_for(harness, scenario, config), averaging_job_for(harness, scenario)]
        for job in jobs:
            control.add_job(job)
    rendezvous = harness.rendezvous()
    procs, lines = [], queue.Queue()
    for w in range(scenario.workers):
        # Absolute paths: the workers run in the repository, not where the run was started.
        argv = ["-m", "hysync.topologies.worker_main", "--scenario",
                str(Path(scenario.path).resolve()),
                "--worker", str(w), "--config", config.name, "--backend", config.backend,
                "--rendezvous", rendezvous, "--seed", str(seed),
                "--out", str(out_dir.resolve() / config.name / f"worker-{w}.json")]
        if jobs:
            job, avg = jobs
            m, a = job.members[w], avg.members[w]  # the workers' order, ids per switch
            argv += [*harness.switch_argv(w), *harness.bind_argv("--bind", m),
                     "--job-id", str(job.job_id),
                     "--slot-base", str(job.slot_base), "--slot-count", str(job.slot_count),
                     *harness.bind_argv("--avg-bind", a), "--avg-job-id", str(avg.job_id),
                     "--avg-slot-base", str(avg.slot_base),
                     "--avg-slot-count", str(avg.slot_count),
                     "--average-every", str(AVERAGE_EVERY_S), "--scale", str(2.0 ** 20)]
        proc = harness.start_worker(w, argv)
        procs.append(proc)
        threading.Thread(target=_pump, args=(w, proc, lines), daemon=True).start()
    policy = None
    try:
        if config.policy == "adaptive":
            (out_dir / config.name).mkdir(parents=True, exist_ok=True)
            policy = control.policy(JOB_ID, out_dir / config.name / "policy.jsonl")
        swaps = _follow(procs, lines, scenario, config, control, policy,
                        (display or QuietDisplay()).line(config.name, scenario.steps),
                        jobs[0].slots if jobs else (0, 0))
    except BaseException:
        for proc in procs:  # a failed run leaves no worker waiting for the others
            proc.kill()
        raise
    finally:
        if policy is not None:
            policy.close()
    for proc in procs:
        proc.wait()
    for job in reversed(jobs):
        control.remove_job(job.job_id)
    logs = []
    for w in range(scenario.workers):
        path = out_dir / config.name / f"worker-{w}.json"
        if not path.exists():
            raise RuntimeError(f"{config.name}: worker {w} wrote no log (exit status "
                               f"{procs[w].returncode}); see the output above")
        logs.append(json.loads(path.read_text()))
    failed = [f"worker {log['worker']}: {log['ended']}" for log in logs
              if log["ended"].startswith("failed")]
    if failed:
        raise RunFailed(f"{config.name}: " + "; ".join(failed))
    return logs, swaps


def _pump(worker: int, proc: subprocess.Popen, lines: queue.Queue) -> None:
    for line in proc.stdout:
        lines.put(line)
    lines.put(worker)  # end of this worker's output: it has finished


def _split_record(output: str) -> tuple[dict | None, str]:
    """A worker's output line: (its progress record, the text beside it). A worker whose
    stderr shares the pipe (Mininet) may have a warning land inside a record's line."""
    if output.startswith("{"):
        try:
            rec, end = _RECORDS.raw_decode(output)
        except json.JSONDecodeError:
            return None, output.strip()
        if isinstance(rec, dict) and "worker" in rec:
            return rec, output[end:].strip()
    return None, output.strip()


_RECORDS = json.JSONDecoder()


def _follow(procs, lines: queue.Queue, scenario: Scenario, config: RunConfig,
            control: JobControl, policy: Policies | None, line: RunLine,
            slots: tuple[int, int]) -> list[Swap]:
    """Show progress on `line`; apply the manual schedule when the job's clock reaches a step, or
    step the adaptive policy every interval until the first worker finishes; exclude a
    finished worker from the training job while others still train, and a worker that
    exits without finishing from the averaging job too."""
    schedule = list(scenario.schedule) if config.policy == "manual-schedule" else []
    finished: set[int] = set()
    steps: dict[int, int] = {}
    swaps: list[Swap] = []
    # The line follows the reference replica, as the summary does (topologies/report.py).
    stragglers = {s.worker for s in scenario.stragglers}
    ref = min(set(range(len(procs))) - stragglers, default=0)
    state = RunState()
    say = line.event
    open_streams, start = len(procs), time.monotonic()
    next_policy_step = start + POLICY_INTERVAL_S

    def finish(worker: int, why: str, *, completed: bool) -> None:
        nonlocal policy
        finished.add(worker)
        if config.backend != "hysync" or len(finished) == len(procs):
            return
        if policy is not None:
            # The policy's work is done once a worker finishes: the last steps are a
            # drain. A member it excluded is readmitted so that it can finish too (its
            # replica is resynchronized by the model averaging).
            policy = None
            for w in sorted(set(range(len(procs))) - finished - control.active(JOB_ID)):
                control.readmit(JOB_ID, w)
                record("readmit", "", 0, w, "the run is draining: the policy stopped")
                say(f"controller: policy stopped; readmitted worker {w}")
        # Take it out of the job, so that a round it will never join cannot hold the
        # members still finishing their last steps (an exited worker: also the averaging).
        job_ids = [JOB_ID] if completed else [JOB_ID, AVG_JOB_ID]
        for job_id in job_ids:
            where = control.exclude(job_id, worker)
            if where is not None:
                say(f"controller: worker {worker} {why}; excluded it from job {job_id}"
                    + (f" at {where}" if where else ""))
        if not completed:
            record("exclude", "", 0, worker, f"worker {why} before finishing")

    def record(action: str, mode: str, quorum: int, worker: int | None = None,
               reason: str = "", level: str = "") -> None:
        swaps.append(Swap(steps.get(0, 0), time.monotonic() - start, mode, quorum, action,
                          worker, reason, level))

    while open_streams:
        try:
            output = lines.get(timeout=0.1 if policy else 0.5)
        except queue.Empty:
            output = ""
        if isinstance(output, int):  # a worker's output ended: it exited
            open_streams -= 1
            if output not in finished:
                finish(output, "exited", completed=False)
            continue
        rec, text = _split_record(output)
        if text:
            say(text)
        if rec is not None:
            w = rec["worker"]
            if rec.get("done"):
                finish(w, "finished training", completed=True)
                continue
            steps[w] = rec["step"]
            state.local_steps[w] = rec["step"] + 1
            if w == ref:
                state.clock = rec["progress"]
                state.mode = rec["mode"] or state.mode
                if rec["accuracy"] is not None:
                    state.accuracy = rec["accuracy"]
            # On the job's clock (the updates every replica applied), not one worker's local
            # steps: a worker the machine starves applies rounds the others closed without
            # stepping itself, and may reach the job's end before its own step 40.
            while schedule and w == ref and rec["progress"] >= schedule[0].at_step:
                swap = schedule.pop(0)
                control.set_mode(JOB_ID, slots=slots, mode=Mode[swap.mode.upper()],
                                 quorum=swap.quorum if swap.mode == "partial" else None,
                                 level=swap.level)
                record("set_mode", swap.mode, swap.quorum, level=swap.level)
                label = swap.mode + (f"({swap.quorum})" if swap.mode == "partial" else "")
                at = f" at {swap.level}" if swap.level else ""
                say(f"controller: job clock {rec['progress']:g} -> "
                    f"mode {label}{at} for slots {slots[0]}-{slots[1]}")
        now = time.monotonic()
        if policy is not None and not finished and now >= next_policy_step:
            next_policy_step = max(next_policy_step + POLICY_INTERVAL_S, now)
            for level, d in policy.step():
                record(d.action, d.mode, d.quorum, d.worker, d.reason, level)
                say(f"policy{' at ' + level if level else ''}: {d.describe()}")
        if steps:
            line.update(state)
    line.finish(state)
    return swaps
