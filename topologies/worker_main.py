"""One training worker of an emulation run or the demo: `python -m hysync.topologies.worker_main`.

DDP in both configurations, so the training code is the same: with `--backend gloo`
DDP averages gradients with gloo's all-reduce (the baseline); with `--backend hysync`
the HySync communication hook replaces that all-reduce and gloo only broadcasts the
initial parameters. Prints one JSON line per step on stdout (the runner reads them
for progress and for the mode schedule) and writes the run log at the end.
"""

from __future__ import annotations

import argparse
import json
import os
import sys
from datetime import timedelta
from pathlib import Path

import torch
import torch.distributed as dist
from torch.distributed.algorithms.ddp_comm_hooks import default_hooks
from torch.nn.parallel import DistributedDataParallel

from hysync import wire
from hysync.controlplane.cli.limits import MAX_SECONDS, ranged
from hysync.topologies.scenario import load_scenario
from hysync.topologies.step_split import StepSplit
from hysync.topologies.workload import (
    RunLog,
    StepRecord,
    TrainConfig,
    accuracy,
    load_digits_split,
    make_model,
    train,
)

# The options' ranges: the runner passes valid ones; a hand-written command line may not.
WORKER = ranged(int, 0, wire.MAX_WORKERS - 1, "--worker")
JOB_ID = ranged(int, 1, wire.MAX_JOBS - 1, "job id")
SLOT = ranged(int, 0, wire.NUM_SLOTS - 1, "slot")
SLOTS = ranged(int, 1, wire.NUM_SLOTS, "slot count")
SECONDS = ranged(float, 1e-3, MAX_SECONDS, "--average-every (seconds)")


def parse_args(argv: list[str] | None = None) -> argparse.Namespace:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--scenario", required=True, type=Path)
    p.add_argument("--worker", required=True, type=WORKER)
    p.add_argument("--config", required=True, help="name of this configuration in the logs")
    p.add_argument("--backend", choices=["hysync", "gloo"], required=True)
    p.add_argument("--rendezvous", required=True, metavar="HOST:PORT",
                   help="gloo TCP store (worker 0 listens there)")
    p.add_argument("--rendezvous-fd", type=ranged(int, 0, 2**31 - 1, "--rendezvous-fd"),
                   metavar="FD", help="worker 0: an inherited TCP socket already listening "
                   "on --rendezvous (the launcher bound the port)")
    p.add_argument("--out", required=True, type=Path, help="the run log file (JSON)")
    p.add_argument("--switch", metavar="HOST:PORT", help="HySync switch data-plane address")
    p.add_argument("--member-id", type=WORKER, metavar="ID",
                   help="this worker's member id at its switch (default: --worker); behind "
                        "a leaf, its id among that leaf's hosts")
    p.add_argument("--behind-leaf", action="store_true",
                   help="--switch is the leaf of a job across leaves and a spine")
    p.add_argument("--bind", metavar="HOST:PORT", help="this worker's HySync UDP address")
    p.add_argument("--bind-fd", type=ranged(int, 0, 2**31 - 1, "--bind-fd"), metavar="FD",
                   help="an inherited UDP socket already bound to --bind (the launcher "
                        "reserved the port)")
    p.add_argument("--job-id", type=JOB_ID, default=1)
    p.add_argument("--slot-base", type=SLOT, default=0)
    p.add_argument("--slot-count", type=SLOTS, default=256)
    p.add_argument("--scale", type=ranged(float, 2.0 ** -126, 2.0 ** 126, "--scale"),
                   default=2.0 ** 20)
    p.add_argument("--avg-bind", metavar="HOST:PORT",
                   help="this worker's UDP address in the model-averaging job (hysync)")
    p.add_argument("--avg-bind-fd", type=ranged(int, 0, 2**31 - 1, "--avg-bind-fd"),
                   metavar="FD", help="an inherited UDP socket already bound to --avg-bind")
    p.add_argument("--avg-job-id", type=JOB_ID, default=2)
    p.add_argument("--avg-slot-base", type=SLOT, default=256)
    p.add_argument("--avg-slot-count", type=SLOTS, default=64)
    p.add_argument("--average-every", type=SECONDS, default=1.0, metavar="SECONDS",
                   help="background model averaging period (hysync)")
    p.add_argument("--lr", type=ranged(float, 1e-12, 10.0, "--lr"),
                   help="learning rate (default: the scenario's)")
    p.add_argument("--seed", type=ranged(int, 0, 2**32 - 1, "--seed"), default=0)
    args = p.parse_args(argv)
    if args.backend == "hysync" and not (args.switch and args.bind and args.avg_bind):
        p.error("--backend hysync needs --switch HOST:PORT, --bind HOST:PORT and "
                "--avg-bind HOST:PORT")
    return args


def _host_port(text: str) -> tuple[str, int]:
    host, _, port = text.rpartition(":")
    return host, int(port)


def _transport_config(args: argparse.Namespace, workers: int, *, job_id: int, bind: str,
                      bind_fd: int | None, slot_base: int, slot_count: int):
    from hysync.worker.transport import TransportConfig

    switch_host, switch_port = _host_port(args.switch)
    bind_host, bind_port = _host_port(bind)
    # dead_after: an excluded member waits, retransmitting, until it is readmitted.
    member_id = args.worker if args.member_id is None else args.member_id
    return TransportConfig(job_id=job_id, worker_id=member_id, switch_host=switch_host,
                           switch_port=switch_port, bind_host=bind_host, bind_port=bind_port,
                           bind_fd=bind_fd, slot_base=slot_base, slot_count=slot_count,
                           members=workers, dead_after=120.0, behind_leaf=args.behind_leaf)


def attach_hysync(model: DistributedDataParallel, args: argparse.Namespace, workers: int,
                  steps: int):
    """Register the HySync hook (timed) and build the model averager (its own job); return
    the averager, a callable giving (mode, contributors, updates applied) of a step, and
    the step's time split."""
    from hysync.worker.api import HySyncWorker
    from hysync.worker.averaging import BackgroundAverager
    from hysync.worker.ddp_hook import HySyncHookState, bucket_key, hysync_hook

    training = HySyncWorker(_transport_config(args, workers, job_id=args.job_id,
                                              bind=args.bind, bind_fd=args.bind_fd,
                                              slot_base=args.slot_base,
                                              slot_count=args.slot_count), scale=args.scale)
    state = HySyncHookState(training)
    split = StepSplit(waited=lambda index: training.last_stats(bucket_key(index)).waited_s)
    model.register_comm_hook(state, split.wrap(hysync_hook))
    averaging = HySyncWorker(_transport_config(args, workers, job_id=args.avg_job_id,
                                               bind=args.avg_bind, bind_fd=args.avg_bind_fd,
                                               slot_base=args.avg_slot_base,
                                               slot_count=args.avg_slot_count),
                             scale=args.scale)
    averager = BackgroundAverager(
        averaging, list(model.module.parameters()),
        period_s=args.average_every, steps=steps,
        needs_resync=lambda: training.needs_resync,
        clear_resync=training.transport.clear_resync,
        uneven_calls=lambda: training.uneven_calls)

    def step_info() -> tuple[str | None, float | None, float]:
        stats = state.last_stats()
        if stats is None or not len(stats.results):
            return None, None, 0.0
        mode = stats.modes.most_common(1)[0][0]
        return mode, float(stats.results["count"].mean()), state.updates_applied()

    return averager, step_info, split


def average_replicas_over_gloo(model: DistributedDataParallel, workers: int) -> None:
    """The gloo baseline's final averaging round (DDP replicas are equal already up to
    floating-point order; this keeps the two backends' run endings alike)."""
    with torch.no_grad():
        params = list(model.module.parameters())
        flat = torch.cat([p.reshape(-1) for p in params])
        dist.all_reduce(flat)
        flat /= workers
        offset = 0
        for p in params:
            p.copy_(flat[offset:offset + p.numel()].reshape(p.shape))
            offset += p.numel()


def tell_runner(record: dict) -> None:
    """One JSON line on stdout, in one write: unbuffered, print() writes the newline
    apart, and a warning on a shared stderr could land between the two."""
    sys.stdout.write(json.dumps(record) + "\n")
    sys.stdout.flush()


def main(argv: list[str] | None = None) -> int:
    args = parse_args(argv)
    torch.set_num_threads(1)  # several workers share two cores
    scenario = load_scenario(args.scenario)
    workers = scenario.workers
    host, port = _host_port(args.rendezvous)
    store = dist.TCPStore(host, port, workers, is_master=args.worker == 0,
                          timeout=timedelta(seconds=120),
                          master_listen_fd=args.rendezvous_fd if args.worker == 0 else None)
    dist.init_process_group("gloo", store=store, rank=args.worker, world_size=workers,
                            timeout=timedelta(seconds=120))
    model = DistributedDataParallel(make_model(scenario.model, args.seed))
    averager = None
    if args.backend == "hysync":
        averager, step_info, split = attach_hysync(model, args, workers, scenario.steps)
    else:
        split = StepSplit()  # gloo's own all-reduce, through the standard hook to time it
        model.register_comm_hook(None, split.wrap(default_hooks.allreduce_hook))

        def step_info() -> tuple[str | None, float | None, float]:
            return "allreduce", float(workers), 1.0
    straggler = scenario.straggler(args.worker)
    log = RunLog(args.config, args.worker, workers)

    def progress(rec: StepRecord) -> None:
        tell_runner({"worker": args.worker, "step": rec.step, "t": round(rec.t, 3),
                     "progress": rec.progress, "loss": round(rec.loss, 4),
                     "accuracy": rec.accuracy, "mode": rec.mode})

    cfg = TrainConfig(steps=scenario.steps, compute_ms=scenario.compute_ms,
                      lr=args.lr if args.lr is not None else scenario.lr,
                      seed=args.seed)
    data = load_digits_split(args.seed)
    try:
        train(model, data, args.worker, workers, cfg, log,
              slowdown=straggler.factor_at if straggler else (lambda t: 1.0),
              dead=straggler.dead_at if straggler else (lambda t: False),
              step_info=step_info, progress=progress, split=split.take,
              **({"on_step": lambda step, clock: averager.at_step(clock),
                  "step_lock": averager.step_lock} if averager else {}))
        if log.ended == "completed":
            # Tell the runner first: it takes this worker out of the training job, so
            # the members still finishing their last steps never wait for it.
            tell_runner({"worker": args.worker, "done": True})
            log.extra["accuracy_before_averaging"] = log.final_accuracy
            if averager is not None:
                # Waits for every member still in the averaging job (a dead one is
                # excluded from it by the runner when its process ends).
                averager.finish(log.steps[-1].progress if log.steps else 0.0)
                log.extra["averaging"] = averager.history
            elif not any(s.pattern == "dies" for s in scenario.stragglers):
                # (gloo has no membership: a dead worker leaves no group to average with)
                average_replicas_over_gloo(model, workers)
            log.final_accuracy = accuracy(model.module, data.x_test, data.y_test)
    except Exception as err:  # noqa: BLE001 - the log must say how the run ended
        log.ended = f"failed: {type(err).__name__}: {err}"
        log.write(args.out)
        print(f"worker {args.worker}: {log.ended}", file=sys.stderr, flush=True)
        return 1
    log.write(args.out)
    # The final parameters, so that replicas can be compared after the run.
    torch.save(model.module.state_dict(), args.out.with_suffix(".pt"))
    if log.ended != "completed":
        os._exit(0)  # a dead worker leaves without the collective shutdown
    if averager is not None:
        averager.close()
    dist.destroy_process_group()
    return 0


if __name__ == "__main__":
    sys.exit(main())
