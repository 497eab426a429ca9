"""The worker process of tests/worker/test_grad_scaler.py (a multiprocessing "spawn" target):
mixed-precision DDP training with a GradScaler, under gloo and behind HySync, with overflow
injected at chosen steps; it reports which steps each scaler skipped."""

from __future__ import annotations

import logging
import time
import traceback
from dataclasses import dataclass
from typing import Any

from tests.worker import procs

STEPS = 10
# Steps 0 and 1 run in step on every mode: DDP rebuilds its buckets at the start of step 1
# with a broadcast, which every rank must reach together.
LOCKSTEP_STEPS = 2
INIT_SCALE = 2.0**8
QUANTIZER_SCALE = 2.0**16  # the scaled gradients fit its range: +-2184 for three members
# Behind HySync, how long a partial member waits for the others of its step before it gives
# up on them: the RTO (the answer a call's chunks held behind a parked packet get, then
# carried) and stall_after (a contribution waiting in an open round, then parked) alike.
# Longer than a busy machine keeps a rank behind the others of its step (seconds under two
# CPU hogs); a member late for a round opens the next one, which waits for the others'
# next step, and parks after it, once per such step.
PARTNER_WAIT_S = 5.0


@dataclass(frozen=True)
class AmpSpec(procs.Spec):
    """The job (`rendezvous`: gloo's init_method), and the overflow to inject."""
    overflow: tuple[tuple[int, tuple[int, ...]], ...] = ()  # (step, ranks whose loss overflows)
    in_turn: bool = False  # behind HySync, ranks take each step one after the other
    # Behind HySync, after the lockstep steps: the ranks with nothing in flight start their
    # backward this long after a rank that still has a packet in flight (parked: a partial
    # member late for the step before), which comes first, as a busy machine may order them.
    lag: float = 0.0


def amp_worker(rank: int, spec: AmpSpec, out: Any, events: dict[str, Any],
               barrier: Any) -> None:
    """Train a small MLP under CPU autocast (bfloat16) with a GradScaler twice from the same
    start: DDP over gloo, then DDP with the HySync hook (gloo only broadcasts and keeps the
    ranks in step). At the steps of `spec.overflow` the listed ranks' loss is multiplied by
    infinity, as an overflow makes it: every gradient element is then inf or NaN. Reports
    the steps each run's scaler skipped (its scale backed off) and its scales."""
    logging.basicConfig(level=logging.ERROR)
    try:
        import torch
        import torch.distributed as dist
        from torch.nn.parallel import DistributedDataParallel

        from hysync.worker.api import HySyncWorker
        from hysync.worker.ddp_hook import HySyncHookState, hysync_hook

        base = spec
        overflow = dict(spec.overflow)
        # Partial rounds: a member whose contribution waits in an open round must not park it
        # (settle it as counted and end its call before the round's result), nor carry the
        # chunks it holds behind a packet parked the step before: its output would then hold
        # the round a step late. No loss on loopback: nothing needs a short timeout.
        config = procs.transport_config(base, rank, rto_max=PARTNER_WAIT_S,
                                        stall_after=PARTNER_WAIT_S,
                                        join_after=2 * PARTNER_WAIT_S, dead_after=30.0)
        hw = HySyncWorker(config, scale=QUANTIZER_SCALE)
        out.put((rank, "bound", hw.address))
        procs._wait(events["go"])
        dist.init_process_group("gloo", init_method=base.rendezvous,
                                rank=rank, world_size=base.members)
        torch.manual_seed(2000 + rank)
        inputs = torch.randn(32, 16)
        targets = torch.randn(32, 4)

        def train(hook: bool) -> dict[str, list[float | int]]:
            torch.manual_seed(0)
            model = torch.nn.Sequential(torch.nn.Linear(16, 32), torch.nn.ReLU(),
                                        torch.nn.Linear(32, 4))
            ddp = DistributedDataParallel(model)
            if hook:
                ddp.register_comm_hook(HySyncHookState(hw), hysync_hook)
            opt = torch.optim.SGD(ddp.parameters(), lr=0.01)
            scaler = torch.amp.GradScaler("cpu", init_scale=INIT_SCALE, growth_interval=10**6)
            skipped: list[int] = []
            scales: list[float] = []
            for step in range(STEPS):
                turns = range(base.members) if hook and spec.in_turn and \
                    step >= LOCKSTEP_STEPS else (rank,)
                for turn in turns:
                    if turn == rank:
                        last = hw.last_stats()
                        if hook and spec.lag and step >= LOCKSTEP_STEPS \
                                and not (last and last.in_flight):
                            time.sleep(spec.lag)
                        opt.zero_grad()
                        with torch.autocast("cpu", dtype=torch.bfloat16):
                            loss = torch.nn.functional.mse_loss(ddp(inputs).float(), targets)
                        if rank in overflow.get(step, ()):
                            loss = loss * float("inf")
                        scaler.scale(loss).backward()
                        before = scaler.get_scale()
                        scaler.step(opt)
                        scaler.update()
                        if scaler.get_scale() < before:  # growth is off: a back-off is a skip
                            skipped.append(step)
                        scales.append(scaler.get_scale())
                    dist.barrier()
            return {"skipped": skipped, "scales": scales}

        gloo = train(hook=False)
        hysync = train(hook=True)
        out.put((rank, "result", {"gloo": gloo, "hysync": hysync,
                                  "needs_resync": hw.needs_resync}))
        dist.destroy_process_group()
        hw.close()
    except BaseException:  # noqa: BLE001 - reported to the test process
        out.put((rank, "error", traceback.format_exc()))
