"""Runs training configurations of a scenario on a switch, and reports on them.

A *harness* says where things run: `LocalHarness` (the demo: processes on this
machine, softswitch on UDP loopback, no root) or `topologies.mininet_harness`
(Mininet hosts behind a softswitch or BMv2 switch). The run itself is the same:
push the pipeline, add the job with the controller, start the workers, follow
their progress, swap modes on the scenario's schedule, collect the logs.
"""

from __future__ import annotations

import json
import os
import queue
import socket
import subprocess
import sys
import threading
import time
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from typing import Protocol

from controlplane.controller import Controller
from controlplane.job import JobConfig, Member
from controlplane.switch import Switch, wait_for_server
from hysync.wire import Mode
from topologies.scenario import Scenario

REPO = Path(__file__).resolve().parents[1]
P4INFO = REPO / "p4src" / "v1model" / "hysync.p4info.txtpb"
JOB_ID = 1
SLOT_BASE = 0
WINDOW = 256  # slots of the job: contributions in flight per worker (a harness may lower it)
POLICIES = ("sync", "partial", "async", "manual-schedule")


class RunFailed(RuntimeError):
    """A worker of a run failed; the message carries each failed worker's reason."""


@dataclass(frozen=True)
class RunConfig:
    """One configuration of a comparison: a backend and, for HySync, a mode policy."""

    name: str
    backend: str  # hysync | gloo
    policy: str = "sync"  # sync | partial | async | manual-schedule
    quorum: int = 0  # partial


class Harness(Protocol):
    grpc_addr: str
    device_config: Path | None
    window: int  # the job's slot count: what the switch can take in flight without loss

    def members(self, workers: int) -> list[Member]: ...
    def switch_data_addr(self) -> str: ...
    def rendezvous(self) -> str: ...
    def start_worker(self, worker: int, argv: list[str]) -> subprocess.Popen: ...


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


class LocalHarness:
    """The embedded default: softswitch on UDP loopback, workers as local processes."""

    def __init__(self, log_dir: Path) -> None:
        self.grpc_addr = f"127.0.0.1:{free_port()}"
        self.device_config = None
        self.window = WINDOW
        self.data_port = free_port()
        self.log = log_dir / "softswitch.log"
        log_dir.mkdir(parents=True, exist_ok=True)
        with open(self.log, "w") as out:
            self.switch = subprocess.Popen(
                [sys.executable, "-m", "softswitch", "--grpc-addr", self.grpc_addr,
                 "--udp", f"127.0.0.1:{self.data_port}"], stdout=out, stderr=subprocess.STDOUT,
                cwd=REPO)

    def members(self, workers: int) -> list[Member]:
        return [Member(worker=w, ipv4="127.0.0.1", mac=f"02:00:00:00:01:{w + 1:02x}",
                       udp_port=47001 + w, switch_port=1) for w in range(workers)]

    def switch_data_addr(self) -> str:
        return f"127.0.0.1:{self.data_port}"

    def rendezvous(self) -> str:
        return f"127.0.0.1:{free_port()}"

    def start_worker(self, worker: int, argv: list[str]) -> subprocess.Popen:
        env = dict(os.environ, GLOO_SOCKET_IFNAME="lo")
        return subprocess.Popen([sys.executable, *argv], stdout=subprocess.PIPE, text=True,
                                cwd=REPO, env=env)

    def close(self) -> None:
        self.switch.terminate()
        try:
            self.switch.wait(timeout=10)
        except subprocess.TimeoutExpired:
            self.switch.kill()


def connect(harness: Harness, timeout: float = 30.0) -> Switch:
    """A primary P4Runtime session with the harness's switch, pipeline pushed."""
    wait_for_server(harness.grpc_addr, timeout)
    switch = Switch(harness.grpc_addr, connect_timeout=5.0)
    switch.push_pipeline(P4INFO, harness.device_config)
    return switch


def job_for(harness: Harness, scenario: Scenario, config: RunConfig) -> JobConfig:
    members = tuple(harness.members(scenario.workers))
    mode = {"partial": Mode.PARTIAL, "async": Mode.ASYNC}.get(config.policy, Mode.SYNC)
    return JobConfig(job_id=JOB_ID, members=members, slot_base=SLOT_BASE,
                     slot_count=harness.window,
                     mode=mode, quorum=config.quorum if mode == Mode.PARTIAL else 0,
                     name=config.name)


@dataclass
class Swap:
    at_step: int
    t: float
    mode: str
    quorum: int


def run_config(harness: Harness, controller: Controller, scenario: Scenario, config: RunConfig,
               out_dir: Path, say: Callable[[str], None] = print) -> tuple[list[dict], list[Swap]]:
    """Train one configuration to the end; return the workers' logs and the swaps made."""
    job = None
    if config.backend == "hysync":
        job = job_for(harness, scenario, config)
        controller.add_job(job)
    rendezvous = harness.rendezvous()
    procs, lines = [], queue.Queue()
    for w in range(scenario.workers):
        argv = ["-m", "topologies.worker_main", "--scenario", str(scenario.path),
                "--worker", str(w), "--config", config.name, "--backend", config.backend,
                "--rendezvous", rendezvous, "--out", str(out_dir / config.name /
                                                          f"worker-{w}.json")]
        if job is not None:
            m = job.member(w)
            argv += ["--switch", harness.switch_data_addr(), "--bind",
                     f"{m.ipv4}:{m.udp_port}", "--job-id", str(job.job_id),
                     "--slot-base", str(job.slot_base), "--slot-count", str(job.slot_count),
                     "--scale", str(2.0 ** 20)]
        proc = harness.start_worker(w, argv)
        procs.append(proc)
        threading.Thread(target=_pump, args=(w, proc, lines), daemon=True).start()
    swaps = _follow(procs, lines, scenario, config, controller, say,
                    (SLOT_BASE, SLOT_BASE + harness.window - 1))
    for proc in procs:
        proc.wait()
    if job is not None:
        controller.remove_job(job.job_id)
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


def _follow(procs, lines: queue.Queue, scenario: Scenario, config: RunConfig,
            controller: Controller, say: Callable[[str], None],
            slots: tuple[int, int]) -> list[Swap]:
    """Show progress every 2 s, apply the manual schedule when worker 0 reaches a step, and
    exclude a finished worker from the job while others still train."""
    schedule = list(scenario.schedule) if config.policy == "manual-schedule" else []
    finished: set[int] = set()

    def finish(worker: int, why: str) -> None:
        # Take it out of the job, so that a round it will never join cannot hold the
        # members still finishing their last steps.
        finished.add(worker)
        if config.backend == "hysync" and len(finished) < len(procs):
            controller.exclude(JOB_ID, worker)
            say(f"  [{config.name}] controller: worker {worker} {why}; excluded it")

    steps, modes, acc, swaps = {}, {}, {}, []
    open_streams, start, last_report = len(procs), time.monotonic(), 0.0
    while open_streams:
        try:
            line = lines.get(timeout=0.5)
        except queue.Empty:
            line = ""
        if isinstance(line, int):  # a worker's output ended: it exited
            open_streams -= 1
            if line not in finished:
                finish(line, "exited")
            continue
        if line.startswith("{"):
            rec = json.loads(line)
            w = rec["worker"]
            if rec.get("done"):
                finish(w, "finished training")
                continue
            steps[w], modes[w] = rec["step"], rec["mode"] or modes.get(w)
            if rec["accuracy"] is not None:
                acc[w] = rec["accuracy"]
            while schedule and w == 0 and rec["step"] >= schedule[0].at_step:
                swap = schedule.pop(0)
                controller.set_mode(JOB_ID, slots=slots,
                                    mode=Mode[swap.mode.upper()],
                                    quorum=swap.quorum if swap.mode == "partial" else None)
                swaps.append(Swap(rec["step"], time.monotonic() - start, swap.mode,
                                  swap.quorum))
                label = swap.mode + (f"({swap.quorum})" if swap.mode == "partial" else "")
                say(f"  [{config.name}] controller: step {rec['step']} of worker 0 -> "
                    f"mode {label} for slots {slots[0]}-{slots[1]}")
        elif line.strip():
            say(f"  [{config.name}] {line.rstrip()}")
        now = time.monotonic()
        if now - last_report >= 2.0 and steps:
            last_report = now
            done = " ".join(f"w{w}={s + 1}" for w, s in sorted(steps.items()))
            say(f"  [{config.name}] {now - start:5.1f}s  steps {done} of {scenario.steps}  "
                f"mode {modes.get(0) or '-'}  accuracy {acc.get(0, 0):.3f}")
    return swaps
