"""`python -m hysync.softswitch` as child processes of a test: one, started on the addresses
asked for, found by the line it prints once it listens, and stopped (killed if it lingers)
when the test leaves it; or a spine and its leaves with the inventory that describes them."""

from __future__ import annotations

import os
import random
import re
import subprocess
import sys
import threading
from collections.abc import Iterator
from contextlib import ExitStack, contextmanager
from dataclasses import dataclass
from pathlib import Path

from hysync import wire
from hysync.controlplane.p4rt.switch import Switch, wait_for_server
from tests.testbed.conftest import P4INFO, fabric_inventory, toml_text

REPO = Path(__file__).resolve().parents[2]
_LISTENING = re.compile(r"P4Runtime on ([\d.]+):(\d+) .*data plane UDP ([\d.]+):(\d+)")


@dataclass(frozen=True)
class SwitchProcess:
    grpc_addr: str
    udp_addr: tuple[str, int]
    log: Path


@contextmanager
def softswitch_process(log: Path, *, udp: str = "127.0.0.1:0", engine: str | None = None,
                       timeout: float = 60.0) -> Iterator[SwitchProcess]:
    """The softswitch with its P4Runtime on a free loopback port and its UDP data plane at
    `udp` (a free loopback port by default), on `engine` (the softswitch's default if None),
    its stderr in `log`; ready for P4Runtime when it is yielded."""
    engine_args = ["--engine", engine] if engine else []
    with open(log, "w") as err:
        proc = subprocess.Popen(
            [sys.executable, "-m", "hysync.softswitch", "--grpc-addr", "127.0.0.1:0", "--udp",
             udp, *engine_args, "--log-level", "warning"], stdout=subprocess.PIPE,
            stderr=err, text=True, cwd=REPO, env=dict(os.environ, PYTHONUNBUFFERED="1"))
    try:
        line: list[str] = []
        reader = threading.Thread(target=lambda: line.append(proc.stdout.readline()),
                                  daemon=True)
        reader.start()
        reader.join(timeout)
        match = _LISTENING.search(line[0]) if line else None
        if match is None:
            raise RuntimeError(f"the softswitch at {udp} did not say where it listens within "
                               f"{timeout:g} s (exit code {proc.poll()}): {line!r}; "
                               f"log: {log.read_text()[-2000:]}")
        grpc_addr = f"{match[1]}:{match[2]}"
        wait_for_server(grpc_addr, timeout, failed=lambda: None if proc.poll() is None
                        else f"the softswitch exited with code {proc.returncode}")
        yield SwitchProcess(grpc_addr, (match[3], int(match[4])), log)
    finally:
        proc.terminate()
        try:
            proc.wait(timeout=10)
        except subprocess.TimeoutExpired:
            proc.kill()
            proc.wait(timeout=10)
        if proc.stdout is not None:
            proc.stdout.close()


@dataclass(frozen=True)
class SoftswitchFabric:
    net: str  # the fabric's loopback 127.x.y: switches at .1 (spine), .2.., hosts at .10
    inventory: Path
    grpc: dict[str, str]  # switch name -> P4Runtime address
    data: dict[str, str]  # switch name -> data address


@contextmanager
def softswitch_fabric(workdir: Path, *, leaves: int, hosts: int,
                      engine: str) -> Iterator[SoftswitchFabric]:
    """A spine and `leaves` leaves, each a softswitch process on `engine` with the HySync
    pipeline pushed, each on its own address of a loopback net drawn at random (the test's
    own), and the inventory of them, workdir/fabric.toml, with `hosts` hosts per leaf."""
    net = f"127.{random.randrange(100, 250)}.{random.randrange(1, 250)}"
    names = ["spine"] + [f"leaf-{i}" for i in range(leaves)]
    data = {"spine": f"{net}.1"} | {f"leaf-{i}": f"{net}.{2 + i}" for i in range(leaves)}
    with ExitStack() as stack:
        grpc = {name: stack.enter_context(softswitch_process(
            workdir / f"{name}.log", udp=f"{data[name]}:{wire.HYSYNC_UDP_PORT}",
            engine=engine)).grpc_addr for name in names}
        for addr in grpc.values():
            with Switch(addr) as switch:
                switch.push_pipeline(P4INFO)
        inventory = workdir / "fabric.toml"
        inventory.write_text(toml_text(fabric_inventory(tuple(grpc.values()), net=net,
                                                        hosts=hosts)))
        yield SoftswitchFabric(net, inventory, grpc, data)
