"""No process of a local run outlives it: the demo killed mid-run (SIGKILL, SIGTERM,
SIGINT) leaves no switch and no worker; so does any parent of `Children`, whatever ends it.

Processes are found by a marker in their environment, which every child inherits."""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import textwrap
import time
import uuid
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[2]
MARK = "HYSYNC_TEST_PROCESS_MARK"


def marked(mark: str) -> list[int]:
    """The live (not zombie) processes whose environment carries MARK=mark."""
    pids = []
    needle = f"{MARK}={mark}".encode()
    for entry in Path("/proc").iterdir():
        if not entry.name.isdigit():
            continue
        try:
            state = (entry / "stat").read_text().rsplit(")", 1)[1].split()[0]
            environ = (entry / "environ").read_bytes()
        except OSError:  # gone meanwhile, or not ours
            continue
        if state != "Z" and needle in environ.split(b"\0"):
            pids.append(int(entry.name))
    return pids


def wait_until(condition, timeout: float, what: str) -> None:
    deadline = time.monotonic() + timeout
    while not condition():
        if time.monotonic() > deadline:
            raise AssertionError(f"timed out after {timeout} s waiting for {what}")
        time.sleep(0.2)


def _ctrl_c_reaches_it() -> None:
    """A Ctrl-C at a terminal reaches the run; a shell starts a background job with SIGINT
    ignored, and a test run in the background would pass that on to the process it sends
    SIGINT to."""
    signal.signal(signal.SIGINT, signal.SIG_DFL)


def start(argv: list[str], mark: str, **popen) -> subprocess.Popen:
    return subprocess.Popen([sys.executable, *argv], env=dict(os.environ, **{MARK: mark}),
                            cwd=ROOT, preexec_fn=_ctrl_c_reaches_it, **popen)


def assert_none_left(mark: str, timeout: float = 20.0) -> None:
    try:
        wait_until(lambda: not marked(mark), timeout, "the processes to end")
    except AssertionError:
        left = marked(mark)
        for pid in left:  # leave nothing behind for the next test either
            os.kill(pid, signal.SIGKILL)
        raise AssertionError(f"processes left behind: {left}") from None


# ------------------------------------------------------------------ Children alone
PARENT = textwrap.dedent("""
    import sys, time
    from hysync.topologies.children import Children, signals_end_the_run
    children = Children()
    with signals_end_the_run(), children:
        for _ in range(2):
            children.start(["/bin/sleep", "600"])
        if GRANDCHILD:  # in its parent's group, so it goes with the group
            children.start(["/bin/sh", "-c", "sleep 600 & wait"])
        print("started", flush=True)
        sys.stdin.readline()  # until the test has seen the children
        END
""")


@pytest.mark.parametrize("how", [signal.SIGKILL, signal.SIGTERM, signal.SIGINT, "exception"])
def test_children_end_with_their_parent_however_it_ends(how) -> None:
    mark = uuid.uuid4().hex
    # A SIGKILL ends the children (the kernel's death signal), not what they started:
    # the run's children start nothing.
    grandchild = how != signal.SIGKILL
    code = f"GRANDCHILD = {grandchild}\n" + PARENT.replace(
        "END", "raise RuntimeError('boom')" if how == "exception" else "time.sleep(600)")
    parent = start(["-c", code], mark, stdin=subprocess.PIPE, stdout=subprocess.PIPE,
                   stderr=subprocess.DEVNULL, text=True)
    try:
        assert parent.stdout.readline() == "started\n"
        expected = 5 if grandchild else 3
        wait_until(lambda: len(marked(mark)) >= expected, 30, "the parent and its children")
        if how == "exception":
            parent.stdin.write("go\n")
            parent.stdin.flush()
        else:
            parent.send_signal(how)
        parent.wait(timeout=30)
    finally:
        parent.kill()
        parent.wait()
    assert_none_left(mark)


def test_a_child_whose_parent_is_already_gone_does_not_start(tmp_path: Path) -> None:
    """The guard checks its parent after asking for the death signal: a parent that ended
    before the request leaves no orphan."""
    proof = tmp_path / "ran"
    run = subprocess.run([sys.executable, "-I", "-S", str(ROOT / "topologies" /
                                                          "die_with_parent.py"),
                          "1", "/bin/touch", str(proof)], timeout=60)  # pid 1: not its parent
    assert run.returncode == 1 and not proof.exists()


GRPC_CALLER = textwrap.dedent("""
    import sys, time
    from concurrent import futures
    import grpc
    from hysync.topologies.children import signals_end_the_run

    def slow(request, context):
        time.sleep(1.5)
        return b"ok"

    server = grpc.server(futures.ThreadPoolExecutor(max_workers=2))
    server.add_generic_rpc_handlers([grpc.method_handlers_generic_handler(
        "test.Slow", {"Call": grpc.unary_unary_rpc_method_handler(slow)})])
    port = server.add_insecure_port("127.0.0.1:0")
    server.start()
    call = grpc.insecure_channel(f"127.0.0.1:{port}").unary_unary("/test.Slow/Call")
    with signals_end_the_run():
        print("calling", flush=True)
        answer = call(b"x", timeout=60)
        print("returned", answer.decode(), flush=True)
        time.sleep(600)
""")


@pytest.mark.parametrize("how", [signal.SIGTERM, signal.SIGINT])
def test_a_signal_inside_a_grpc_call_ends_the_run_once_the_call_returns(how) -> None:
    """Raised inside grpc's wait, the exception would unwind through a held lock (a hang,
    or "cannot release un-acquired lock"): the run ends right after the call instead."""
    caller = start(["-c", GRPC_CALLER], uuid.uuid4().hex, stdout=subprocess.PIPE,
                   stderr=subprocess.PIPE, text=True)
    try:
        assert caller.stdout.readline() == "calling\n"
        time.sleep(0.5)  # inside the call: the server answers after 1.5 s
        caller.send_signal(how)
        out, err = caller.communicate(timeout=60)
    finally:
        caller.kill()
        caller.wait()
    assert out == "returned ok\n", err
    assert caller.returncode == (-how if how == signal.SIGINT else 128 + how), err
    assert "un-acquired" not in err


# ------------------------------------------------------------------ the demo
SCENARIO = """
name = "kill-test"
workers = 2
steps = 100000
compute_ms = 20.0
"""


@pytest.mark.slow
@pytest.mark.parametrize("how", [signal.SIGKILL, signal.SIGTERM, signal.SIGINT])
def test_the_demo_killed_mid_run_leaves_no_process(tmp_path: Path, how) -> None:
    scenario = tmp_path / "long.toml"
    scenario.write_text(SCENARIO)
    mark = uuid.uuid4().hex
    # stderr to a file, not a pipe: nobody reads a pipe while the demo runs, and once the
    # workers' warnings fill it the demo blocks on its own "interrupted" line
    errors = tmp_path / "stderr.txt"
    with errors.open("w") as stderr:
        demo = start(["-m", "hysync.topologies.demo", "--scenario", str(scenario), "--out",
                      str(tmp_path / "out"), "--skip-baseline"], mark,
                     stdout=subprocess.DEVNULL, stderr=stderr)
    try:
        # the demo, the softswitch and both workers, training: a worker's log line
        wait_until(lambda: len(marked(mark)) >= 4 or demo.poll() is not None, 240,
                   "the demo's switch and workers")
        assert demo.poll() is None, errors.read_text()
        time.sleep(2.0)  # mid-run
        demo.send_signal(how)
        code = demo.wait(timeout=60)
    finally:
        demo.kill()
        demo.wait()
    if how != signal.SIGKILL:
        assert code in (130, 128 + how), code
    assert_none_left(mark)
