"""Hot swaps as fast as the controller writes them, under traffic (docs/protocol.md, swap
storms): four workers all-reduce while the test flips the job's desired mode between two
modes; every pair of modes must keep the job going and apply every gradient exactly once."""

from __future__ import annotations

import threading
import time

import pytest

from hysync.wire import Mode
from tests.worker import procs
from tests.worker.cluster import Cluster
from tests.worker.relay import Impairment, LossyRelay
from tests.worker.test_modes import check_exactly_once, spec_for

pytestmark = pytest.mark.slow

QUORUM = 3
PAIRS = {"sync-async": (Mode.SYNC, Mode.ASYNC), "sync-partial": (Mode.SYNC, Mode.PARTIAL),
         "partial-async": (Mode.PARTIAL, Mode.ASYNC)}
REPEATS = 2  # each pair runs twice per CI run: a storm's interleavings differ run to run
CALLS = 60
SWAP_INTERVAL = 0.002  # seconds between writes: leaves the in-process data plane the GIL


class SwapStorm(threading.Thread):
    """Flip the job's mode between `modes` until stopped; count the writes."""

    def __init__(self, switch, job, modes: tuple[Mode, Mode]) -> None:
        super().__init__(daemon=True)
        self.switch, self.job, self.modes = switch, job, modes
        self.swaps = 0
        self.stop = threading.Event()

    def run(self) -> None:
        while not self.stop.wait(SWAP_INTERVAL):
            mode = self.modes[self.swaps % 2 == 0]
            self.switch.set_mode(self.job, mode, QUORUM if mode == Mode.PARTIAL else 0)
            self.swaps += 1


@pytest.mark.parametrize("repeat", range(REPEATS), ids=lambda r: f"run{r + 1}")
@pytest.mark.parametrize("pair", PAIRS)
def test_a_swap_storm_never_stalls_a_job_and_applies_every_gradient_once(switch, pair, repeat):
    modes = PAIRS[pair]
    # A relay that loses nothing: it only records what the switch sent.
    relay = LossyRelay(switch.address, seed=11, up=Impairment(), down=Impairment()).start()
    try:
        spec = spec_for(relay.address, calls=CALLS)
        with Cluster(procs.phased_worker, spec) as cluster:
            job = cluster.install(switch, relay)
            cluster.collect("warm")
            storm = SwapStorm(switch, job, modes)
            started = time.monotonic()
            storm.start()
            cluster.events["phase"].set()
            try:
                cluster.collect("done")
            finally:
                storm.stop.set()
                storm.join()
            elapsed = time.monotonic() - started
            results = cluster.finish_phased(switch, job)
    finally:
        relay.stop()
    joins = sum(r["joins"] for r in results.values())
    print(f"{pair}: {storm.swaps} swaps in {elapsed:.1f} s, {joins} JOINs offered")
    assert storm.swaps >= 100, "the storm was too short to mean anything"
    check_exactly_once(spec, results, relay, every_replica_whole=True)
