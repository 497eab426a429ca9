"""Hot-swap latency under load: from `mode set` to every slot of the range latched.

A softswitch process (UDP data plane, real P4Runtime), a 4-member job installed by
the controller, 4 sender processes keeping every slot of the range busy. After a
warm-up the controller swaps the range sync -> partial(3) (`Controller.set_mode`,
the call `hysync mode set` makes). Two latencies are reported:

* observed: until the last slot of the range returned its first result aggregated
  under the new mode (read from the result headers the senders receive): the truth;
* controller: what `Controller.wait_latched` (and `hysync mode set --wait`) reports
  from counters: a conservative bound, so it is expected to be later.

    .venv/bin/python -m bench.hotswap_bench [--slots 64 4096] [--repeats 3]

Writes bench/results/hotswap.json: one row per (slots, repeat).
"""

from __future__ import annotations

import argparse
import json
import multiprocessing as mp
import os
import socket
import statistics
import tempfile
import time
from pathlib import Path

from bench.senders import sender_main
from hysync.controlplane.controller import Controller
from hysync.controlplane.job import JobConfig, Member
from hysync.controlplane.p4rt.switch import Switch, wait_for_server
from hysync.topologies.runner import P4INFO, start_softswitch
from hysync.wire import Mode

RESULTS = Path(__file__).resolve().parent / "results"
JOB = 1
SENDERS = 4


def one_swap(slots: int, warmup: float = 1.5) -> dict:
    # Ports the switch bound itself (port 0) and printed: none chosen here and bound later.
    switch_proc, grpc_addr, data_port = start_softswitch(
        Path(tempfile.gettempdir()) / f"hotswap-softswitch-{os.getpid()}.log")
    ctx = mp.get_context("spawn")
    start, out = ctx.Event(), ctx.Queue()
    try:
        switch = _connect(grpc_addr)
        switch.push_pipeline(P4INFO)
        controller = Controller(switch).attach()
        # The senders' sockets, bound here to ports the kernel chose, which the job names;
        # each sender process gets its own.
        socks = [socket.socket(socket.AF_INET, socket.SOCK_DGRAM) for _ in range(SENDERS)]
        for s in socks:
            s.bind(("127.0.0.1", 0))
        members = tuple(Member(w, "127.0.0.1", f"02:00:00:00:02:{w:02x}",
                               socks[w].getsockname()[1], 1) for w in range(SENDERS))
        controller.add_job(JobConfig(JOB, members, 0, slots))
        run_for = warmup + 5.0 + slots / 500
        senders = [ctx.Process(target=sender_main, args=(w, JOB, data_port, (0, slots),
                                                         run_for, start, out, Mode.PARTIAL),
                               kwargs={"sock": socks[w]})
                   for w in range(SENDERS)]
        for p in senders:
            p.start()
        for s in socks:
            s.close()  # each sender holds its own copy
        time.sleep(1.0)
        start.set()
        time.sleep(warmup)
        t0 = time.monotonic()
        controller.set_mode(JOB, slots=(0, slots - 1), mode=Mode.PARTIAL, quorum=3)
        written = time.monotonic() - t0
        try:
            counter_s = controller.wait_latched(JOB, (0, slots - 1), Mode.PARTIAL, timeout=30)
        except Exception as err:  # noqa: BLE001 - reported, not fatal to the bench
            counter_s = float("nan")
            print(f"    wait_latched: {err}", flush=True)
        latched: dict[int, float] = {}
        for _ in senders:
            _, seen = out.get(timeout=run_for + 60)
            for slot, t in seen.items():
                latched[slot] = min(t, latched.get(slot, t))
        for p in senders:
            p.join(timeout=10)
        switch.close()
    finally:
        switch_proc.terminate()
        switch_proc.wait(timeout=10)
    missing = slots - len(latched)
    observed = (max(latched.values()) - t0) * 1000 if latched and not missing else float("nan")
    return {"slots": slots, "latch_ms": round(observed, 2), "write_ms": round(written * 1000, 2),
            "controller_latch_ms": round(counter_s * 1000, 2),
            "slots_not_latched": missing}


def _connect(addr: str) -> Switch:
    wait_for_server(addr)
    return Switch(addr, connect_timeout=5.0)


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--slots", type=int, nargs="+", default=[64, 4096])
    parser.add_argument("--repeats", type=int, default=3)
    args = parser.parse_args(argv)
    rows = []
    for slots in args.slots:
        for i in range(args.repeats):
            print(f"hot swap, {slots} slots, run {i + 1}/{args.repeats} ...", flush=True)
            rows.append(one_swap(slots))
            r = rows[-1]
            print(f"    observed {r['latch_ms']} ms, controller bound {r['controller_latch_ms']}"
                  f" ms, write {r['write_ms']} ms", flush=True)
        runs = [r["latch_ms"] for r in rows if r["slots"] == slots]
        print(f"  {slots} slots: median observed latch {statistics.median(runs):.1f} ms")
    RESULTS.mkdir(exist_ok=True)
    (RESULTS / "hotswap.json").write_text(json.dumps(rows, indent=2) + "\n")
    print(f"wrote {RESULTS / 'hotswap.json'}")


if __name__ == "__main__":
    main()
