"""Mixed precision behind HySync: a GradScaler skips the same steps as under gloo.

A GradScaler skips a step (and backs its scale off) exactly when a gradient it unscales is
not finite. Under gloo a NaN or an infinity on any rank is in every rank's averaged
gradient; behind HySync it travels as the overflow sentinel and decodes as NaN on every
member (docs/protocol.md §9, "Non-finite values"), so the scalers of every rank skip the
steps gloo's do: in sync (one rank's overflow, or every rank's), in partial (every rank's,
as a loss scale too high gives: a member a round closed without has its own absorbed
there, not carried into the next step; also when the member late for the step before
comes first by seconds, as a busy machine orders them) and in async (the ranks stepping in
turn, the overflowing one first: an async round reaches the members whose step comes after
it).
"""

from __future__ import annotations

import pytest

from hysync.wire import Mode
from tests.worker.amp_procs import PARTNER_WAIT_S, STEPS, AmpSpec, amp_worker
from tests.worker.cluster import Cluster

pytestmark = pytest.mark.slow

N = 3


PARTIAL_OVERFLOW = ((3, (0, 1, 2)), (6, (0, 1, 2)))
CASES = {
    # (mode, quorum, overflow: step -> ranks, ranks in turn, lag: AmpSpec.lag)
    "sync": (Mode.SYNC, 0, ((3, (1,)), (6, (0, 1, 2))), False, 0.0),
    "partial": (Mode.PARTIAL, 2, PARTIAL_OVERFLOW, False, 0.0),
    # The member late for the step before comes first, its slots held by its parked
    # packets, and the others half its wait for them later: as a busy machine orders them.
    "partial-ahead": (Mode.PARTIAL, 2, PARTIAL_OVERFLOW, False, PARTNER_WAIT_S / 2),
    "async": (Mode.ASYNC, 0, ((3, (0,)), (6, (0,))), True, 0.0),
}


@pytest.mark.parametrize("case", list(CASES))
def test_the_scaler_skips_the_steps_it_skips_under_gloo(switch, case, tmp_path):
    mode, quorum, overflow, in_turn, lag = CASES[case]
    # 16 slots for the model's 11 chunks: one chunk a slot, one round a slot per step
    spec = AmpSpec(job_id=4, members=N, slot_base=0, slot_count=16, switch=switch.address,
                   rto_min=PARTNER_WAIT_S, overflow=overflow, in_turn=in_turn, lag=lag,
                   # gloo's rendezvous through a file: no TCP port picked here to bind later
                   rendezvous=f"file://{tmp_path / 'gloo-store'}")
    with Cluster(amp_worker, spec) as cluster:
        cluster.install(switch, None, mode, quorum)
        results = cluster.collect("result")
    injected = [step for step, _ranks in overflow]
    for rank, r in results.items():
        gloo, hysync = r["gloo"], r["hysync"]
        assert gloo["skipped"] == injected, (rank, gloo)  # every rank, under gloo
        assert hysync["skipped"] == gloo["skipped"], (case, rank, hysync, gloo)
        assert hysync["scales"] == gloo["scales"] and len(hysync["scales"]) == STEPS
