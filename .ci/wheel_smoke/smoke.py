"""The wheel, alone: run with the python of a fresh venv that has only the wheel (and
torch) installed, from a directory outside any clone.

    python smoke.py dist/hysync-*.whl

Checks that the wheel's top-level names are `hysync` and its dist-info only, that
`hysync` is imported from the venv, `hysync --version`, then starts the softswitch,
pushes the packaged P4Info and a job with the CLI, deploys a loopback inventory that
names the packaged P4Info, serves it, and trains two ranks with `torchrun --standalone`
through `hysync.torch.attach` from a script whose folder has its own worker.py, then runs
the README's quick start (the packaged examples/train_ddp.py, 200 updates) against the
same serve. Exits non-zero with the reason on the first failure.
"""

from __future__ import annotations

import importlib.util
import json
import os
import shutil
import signal
import socket
import subprocess
import sys
import tempfile
import time
import zipfile
from importlib.metadata import version
from pathlib import Path

HERE = Path(__file__).resolve().parent
BIN = Path(sys.executable).parent


def fail(why: str) -> None:
    print(f"wheel smoke: FAILED: {why}", flush=True)
    sys.exit(1)


def free_port(kind: int = socket.SOCK_STREAM) -> int:
    with socket.socket(socket.AF_INET, kind) as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def cli(*args: str) -> str:
    done = subprocess.run([str(BIN / "hysync"), *args], capture_output=True, text=True,
                          timeout=60)
    if done.returncode != 0:
        fail(f"hysync {' '.join(args)}: {done.stderr.strip()}")
    return done.stdout


def wait_port(port: int, proc: subprocess.Popen, what: str, timeout: float = 30) -> None:
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        if proc.poll() is not None:
            fail(f"{what} exited with status {proc.returncode}")
        with socket.socket() as s:
            if s.connect_ex(("127.0.0.1", port)) == 0:
                return
        time.sleep(0.2)
    fail(f"{what} did not listen on {port} within {timeout:g} s")


def main() -> None:
    wheel = Path(sys.argv[1])
    with zipfile.ZipFile(wheel) as z:
        top = {name.split("/")[0] for name in z.namelist()}
    dist_info = f"hysync-{version('hysync')}.dist-info"
    if top != {"hysync", dist_info}:
        fail(f"the wheel's top-level names are {sorted(top)}, not hysync and {dist_info}")
    import hysync
    import hysync.resources

    if Path(sys.prefix) not in Path(hysync.__file__).resolve().parents:
        fail(f"hysync was imported from {hysync.__file__}, not from the venv {sys.prefix}")
    said = cli("--version").strip()
    if said != f"hysync {hysync.__version__}" or hysync.__version__ != version("hysync"):
        fail(f"hysync --version says {said!r}, the package {hysync.__version__}")
    print(said)

    work = Path(tempfile.mkdtemp(prefix="hysync-smoke-"))
    procs: list[subprocess.Popen] = []
    try:
        grpc, udp, serve = free_port(), free_port(socket.SOCK_DGRAM), free_port()
        procs.append(subprocess.Popen(
            [sys.executable, "-m", "hysync.softswitch", "--grpc-addr", f"127.0.0.1:{grpc}",
             "--udp", f"127.0.0.1:{udp}", "--log-level", "warning"], cwd=work))
        wait_port(grpc, procs[-1], "the softswitch")
        addr = f"--grpc-addr=127.0.0.1:{grpc}"
        print(cli(addr, "pipeline", "push", "--p4info",
                     "hysync:p4src/v1model/hysync.p4info.txtpb").strip())
        job = work / "job.toml"
        job.write_text(JOB)
        print(cli(addr, "job", "add", str(job)).strip())
        listed = json.loads(cli(addr, "--json", "job", "list"))["jobs"]
        if [(j["job_id"], j["slots"], j["members"]) for j in listed] != [(7, [512, 527], 2)]:
            fail(f"job list does not show the job just added: {listed}")
        print(cli(addr, "job", "remove", "7").strip())

        # the packaged loopback inventory, on this run's ports
        text = hysync.resources.path("examples/loopback.toml").read_text()
        text = (text.replace('"127.0.0.1:9559"', f'"127.0.0.1:{grpc}"')
                .replace("data_udp_port = 48620", f"data_udp_port = {udp}")
                .replace('"127.0.0.1:9600"', f'"127.0.0.1:{serve}"'))
        inventory = work / "loopback.toml"
        inventory.write_text(text)
        print(cli("deploy", str(inventory)).strip())
        procs.append(subprocess.Popen([str(BIN / "hysync"), "serve", str(inventory),
                                       "--policy", "none"], cwd=work))
        wait_port(serve, procs[-1], "hysync serve")

        script_dir = work / "user"
        script_dir.mkdir()
        for name in ("train.py", "worker.py"):
            shutil.copy(HERE / name, script_dir / name)
        env = dict(os.environ, OMP_NUM_THREADS="1")
        env.pop("PYTHONPATH", None)
        results = two_ranks(script_dir / "train.py", inventory, 30, work, env, "torchrun")
        for r in results:
            if not (r["last_loss"] < 0.5 * r["first_loss"] and r["updates"] >= 30):
                fail(f"rank {r['rank']} did not train: {r}")
            if r["worker"] != "the user's worker.py":
                fail(f"rank {r['rank']} imported another worker module: {r['worker']}")
        if len({r["params"] for r in results}) != 1:
            fail(f"the replicas' parameters differ: {results}")
        print(f"trained 2 ranks: loss {results[0]['first_loss']:.3g} -> "
              f"{results[0]['last_loss']:.3g}, replicas identical")
        quick_start(inventory, work, env)
    finally:
        for p in reversed(procs):
            p.send_signal(signal.SIGINT)
            try:
                p.wait(timeout=15)
            except subprocess.TimeoutExpired:
                p.kill()
        shutil.rmtree(work, ignore_errors=True)
    print("wheel smoke: ok", flush=True)


def quick_start(inventory: Path, work: Path, env: dict[str, str]) -> None:
    """The README's quick start from the wheel: the packaged examples/train_ddp.py, 200
    updates on two ranks, with the base install's data (no scikit-learn in this venv)."""
    import hysync.resources

    if importlib.util.find_spec("sklearn") is not None:
        fail("scikit-learn is installed: the quick start would not run on the base install")
    example = hysync.resources.path("examples/train_ddp.py")
    results = two_ranks(example, inventory, 200, work, env, "the quick start's torchrun")
    for r in results:
        # 200 updates as the README says, counted in whole updates; the synthetic data
        # are as hard as the digits (a model that did not train scores about 0.1)
        if r["data"] != "synthetic" or r["updates"] != 200 or r["accuracy"] < 0.9:
            fail(f"quick start, rank {r['rank']}: {r}")
    print(f"quick start: 2 ranks, 200 updates, held-out accuracy "
          f"{', '.join(str(r['accuracy']) for r in sorted(results, key=lambda r: r['rank']))}"
          f" on the base install's data")


JOB = """job_id = 7
name = "loopback"
lanes = 64
scale = 65536.0
mode = "sync"
[slots]
base = 512
count = 16
[[members]]
worker = 0
ipv4 = "127.0.0.1"
mac = "02:00:00:00:00:01"
udp_port = 47001
switch_port = 1
[[members]]
worker = 1
ipv4 = "127.0.0.1"
mac = "02:00:00:00:00:02"
udp_port = 47002
switch_port = 1
"""


def two_ranks(script: Path, inventory: Path, steps: int, work: Path, env: dict[str, str],
              what: str) -> list[dict]:
    """`script` under torchrun on two ranks for `steps` updates: each rank's result line."""
    run = subprocess.run(
        [str(BIN / "torchrun"), "--standalone", "--nproc-per-node", "2", str(script),
         "--inventory", str(inventory), "--steps", str(steps)],
        cwd=work, env=env, capture_output=True, text=True, timeout=300)
    if run.returncode != 0:
        fail(f"{what} exited with {run.returncode}:\n{run.stdout[-3000:]}{run.stderr[-3000:]}")
    results = [json.loads(line) for line in run.stdout.splitlines()
               if line.startswith('{"rank"')]
    if sorted(r["rank"] for r in results) != [0, 1]:
        fail(f"{what}: no result line from ranks 0 and 1:\n{run.stdout}{run.stderr}")
    return results


if __name__ == "__main__":
    main()

