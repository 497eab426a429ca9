"""`python -m hysync.softswitch` as a child process of a test: started on the addresses asked
for, found by the line it prints once it listens, and stopped (killed if it lingers) when the
test leaves it."""

from __future__ import annotations

import os
import re
import subprocess
import sys
import threading
from collections.abc import Iterator
from contextlib import contextmanager
from dataclasses import dataclass
from pathlib import Path

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
    # Imported here: the e2e worker processes import this module's neighbours without grpc.
    from hysync.controlplane.p4rt.switch import wait_for_server

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
