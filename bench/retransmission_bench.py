"""Retransmissions into a silent switch over real sockets: what a late member costs the
early one, and the RTO a run of prompt answers leaves.

The reference softswitch in process (UDP on loopback), a 2-member sync job of 16 slots, the
real transport. After a warm-up call, each case is one call of both members with the late
member `late_s` after the early one; the early member's retransmissions and RTO after the
call are reported. The cases are those tests/worker/test_retransmission.py checks on a
simulated clock: a wait of 0.08 s, a prompt call of 40 chunks a slot, the same wait again
shorter (0.05 s), a longer one (0.4 s). On a busy machine the late member is later than
asked (its thread waits for a core) and the RTO higher: numbers, not pass or fail.

    .venv/bin/python -m bench.retransmission_bench [--repeats 3] [--out FILE]
"""

from __future__ import annotations

import argparse
import json
import threading
import time
from pathlib import Path

import numpy as np

from hysync import wire
from hysync.softswitch.pipeline import Pipeline
from hysync.softswitch.udp_dataplane import UdpDataPlane
from tests.worker.conftest import Job, Switch
from tests.worker.test_failures import BASE, JOB, make_transport

SLOTS = 16
CASES = (("wait", "g", 0.08, 1), ("prompt", "p", 0.0, 40), ("same wait, shorter", "g", 0.05, 1),
         ("longer wait", "g", 0.4, 1))


def call(early, late, key: str, late_s: float, chunks_per_slot: int) -> dict:
    # (within the quantizer's range for two members at its scale: +-341)
    values = np.arange(SLOTS * chunks_per_slot * wire.LANES, dtype=np.float32) % 300
    results = {}
    thread = threading.Thread(target=lambda: results.update(early=early.allreduce(key, values)))
    thread.start()
    asked = time.monotonic()
    time.sleep(late_s)
    late_by = time.monotonic() - asked
    results["late"] = late.allreduce(key, values)
    thread.join()
    stats = results["early"].stats
    return {"late_s": late_s, "late_by_s": round(late_by, 4), "retransmits": stats.retransmits,
            "rto_ms": round(stats.rto_s * 1e3, 2)}


def one_run() -> list[dict]:
    pipeline = Pipeline()
    dataplane = UdpDataPlane(pipeline, "127.0.0.1", 0).start()
    switch = Switch(pipeline, dataplane)
    early = make_transport(switch.address[1], worker=0, members=2, slots=SLOTS)
    late = make_transport(switch.address[1], worker=1, members=2, slots=SLOTS)
    try:
        switch.install(Job(JOB, BASE, SLOTS, [(0, *early.address), (1, *late.address)]))
        call(early, late, "w", 0.0, 1)  # every slot heard from: sync
        return [{"case": name, **call(early, late, key, late_s, chunks)}
                for name, key, late_s, chunks in CASES]
    finally:
        early.close()
        late.close()
        dataplane.stop()


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--repeats", type=int, default=3)
    parser.add_argument("--out", type=Path, help="also write the rows there (JSON)")
    args = parser.parse_args(argv)
    rows = []
    for repeat in range(args.repeats):
        for row in one_run():
            rows.append({"repeat": repeat, **row})
            print(json.dumps(rows[-1]), flush=True)
    if args.out:
        args.out.write_text(json.dumps(rows, indent=1) + "\n")


if __name__ == "__main__":
    main()
