"""The `hysync` torch.distributed backend: `dist.all_reduce` through the switch.

    import hysync.backend                                  # registers "hysync"
    dist.init_process_group("hysync")                      # HYSYNC_INVENTORY=rack.toml
    model = DistributedDataParallel(net)                   # no hook: DDP's all-reduces
    ...                                                    # go through the switch

or with the options in code instead of the environment:

    dist.init_process_group("hysync", pg_options=hysync.backend.Options(
        inventory="rack.toml", mode="sync", policy="adaptive"))

Creating the group admits a job exactly as `hysync.torch.attach` does (the same
`hysync.torch.admit`: every rank publishes its UDP address through the group's store,
rank 0 asks the inventory's `hysync serve`, whose connection is the job's lease), with
the same mode and policy. `all_reduce` of a floating-point tensor (float32, float16,
bfloat16, float64; the others are converted to float32 for the switch and back) with SUM
or AVG goes through the job's `HySyncWorker`, CPU and CUDA tensors alike; every other
collective (broadcast, all_gather, barrier, reduce_scatter, all_to_all, send/recv, ...)
goes to a gloo group (CUDA tensors: NCCL where torch has it) created from the same store
under a prefix of its own, so its keys never meet HySync's. A CUDA tensor takes the
worker's CUDA path (pinned staging, a copy stream: tests/worker/test_cuda.py); the
backend's own CUDA use, NCCL included, has no test on the CPU-only machines the suite
runs on.

The switch computes the mean over the members (in partial and async modes, the mean of
the rounds it applied: docs/protocol.md §9); SUM is that times the group's size, so its
error is the quantization error times the size (2**-21 per member at the default scale,
for values within the quantizer's range, docs/protocol.md §9; HYSYNC_SCALE trades range
for precision). Each tensor size is one key of the transport, with its error feedback,
since a process group is not told which tensor a call carries: in sync mode every call
is one round of every member and the key only names its slots; in partial and async
modes, late rounds are applied to the next call of the same size, which may be another
tensor of that size (the hook keys by DDP bucket and applies them to the same bucket).

MAX, MIN and PRODUCT are not sums, and an integer sum must be exact: they are refused
with one line, or with `exact_ops="gloo"` (HYSYNC_EXACT_OPS=gloo) sent to the
gloo group, as trainers that reduce integer flags or counters need.

torch installs a Python backend as the whole process group (distributed_c10d replaces
the group with the object the backend returns), so the mixed forms
`"cpu:hysync,cuda:nccl"` and `"cpu:gloo,cuda:hysync"` give the same group as "hysync":
all-reduces of either device through the switch, the rest through gloo / NCCL.

With `ranks_per_host` (HYSYNC_RANKS_PER_HOST; "local" for torchrun's `--nproc-per-node`
on every host), each host's ranks reduce there first and only its leader is a switch
member (hysync/host_group.py): an all-reduce is then a reduce onto the leader, the
host's mean through the switch, and a broadcast of the leader's result, so SUM is still
the switch's mean times the group's size.

Each group this backend makes is a job of its own, with its own slots from the pool: a
`dist.new_group()` under a "hysync" default group too.

`dist.destroy_process_group()` leaves the job (the other members' rounds stop waiting
for this one), waits for the other ranks, and rank 0 releases the job.
"""

from __future__ import annotations

import os
from collections.abc import Callable
from dataclasses import dataclass
from datetime import timedelta
from pathlib import Path

import torch
import torch.distributed as dist
from torch._C._distributed_c10d import ProcessGroup, Work, _DistributedBackendOptions

from hysync.controlplane.testbed.inventory import Inventory
from hysync.host_group import RANKS_PER_HOST_ENV
from hysync.torch import DEFAULT_TIMEOUT, AttachError, admit
from hysync.worker.api import DEFAULT_SCALE
from hysync.worker.ddp_hook import HySyncHookState, switch_call

NAME = "hysync"
INVENTORY_ENV = "HYSYNC_INVENTORY"
MODE_ENV = "HYSYNC_MODE"
POLICY_ENV = "HYSYNC_POLICY"
SCALE_ENV = "HYSYNC_SCALE"
EXACT_OPS_ENV = "HYSYNC_EXACT_OPS"

FLOAT_DTYPES = (torch.float32, torch.float16, torch.bfloat16, torch.float64)
SUPPORTED = "SUM or AVG of float32, float16, bfloat16 or float64 tensors"


@dataclass(slots=True)
class Options:
    """`init_process_group(backend="hysync", pg_options=Options(...))`; a field left None
    is taken from the environment (HYSYNC_INVENTORY, HYSYNC_HOST, HYSYNC_MODE,
    HYSYNC_POLICY, HYSYNC_SCALE, HYSYNC_EXACT_OPS, HYSYNC_RANKS_PER_HOST), then
    `attach`'s defaults."""

    inventory: str | Path | Inventory | None = None
    host: str | None = None
    mode: str | None = None  # "sync" (default), "partial", "async": the job's first mode
    policy: str | None = None  # the serve's policy for the job, as attach's `policy`
    scale: float | None = None  # quantizer units per 1.0 (default 2**20)
    exact_ops: str | None = None  # "error" (default) or "gloo": MAX, MIN, ..., integers
    token_file: str | Path | None = None
    ranks_per_host: int | str | None = None  # as attach's; None: HYSYNC_RANKS_PER_HOST or 1

    def resolved(self) -> Options:
        env = os.environ
        inventory = self.inventory or env.get(INVENTORY_ENV)
        if inventory is None:
            raise AttachError(f"the hysync backend needs an inventory: set {INVENTORY_ENV} "
                              "or pass pg_options=hysync.backend.Options(inventory=...)")
        exact = self.exact_ops or env.get(EXACT_OPS_ENV) or "error"
        if exact not in ("error", "gloo"):
            raise AttachError(f"exact_ops ({EXACT_OPS_ENV}) is 'error' or 'gloo', got {exact!r}")
        scale = self.scale if self.scale is not None else float(env.get(SCALE_ENV,
                                                                         DEFAULT_SCALE))
        return Options(inventory=inventory, host=self.host, mode=self.mode or env.get(
            MODE_ENV) or "sync", policy=self.policy or env.get(POLICY_ENV), scale=scale,
            exact_ops=exact, token_file=self.token_file,
            ranks_per_host=self.ranks_per_host or env.get(RANKS_PER_HOST_ENV))


class HySyncWork(Work):
    """An all-reduce in flight: `wait()` and `get_future()` as torch's own Work objects,
    the future holding the list of result tensors (the caller's, overwritten)."""

    def __init__(self, future: torch.futures.Future) -> None:
        super().__init__()
        self._future = future

    def wait(self, timeout: timedelta | None = None) -> bool:
        self._future.wait()  # a failed call raises here, as torch's backends do
        return True

    def is_completed(self) -> bool:
        return self._future.done()

    def is_success(self) -> bool:
        if not self._future.done():
            return False
        try:
            self._future.value()
        except Exception:  # noqa: BLE001 - a failure is what this reports
            return False
        return True

    def get_future(self) -> torch.futures.Future:
        return self._future

    def result(self) -> list[torch.Tensor]:
        return self._future.value()


class HySyncProcessGroup(ProcessGroup):
    """all_reduce through the switch; every other collective through the inner groups,
    which are registered as this group's backends so that torch's C++ side (barrier,
    DDP's parameter checks and broadcasts) finds them too."""

    def __init__(self, store: dist.Store, rank: int, size: int, timeout: timedelta,
                 options: Options | None = None) -> None:
        super().__init__(rank, size)
        options = (options or Options()).resolved()
        self.options = options
        # The inner groups' rendezvous keys under prefixes of their own: HySync's keys
        # (hysync/member/R, hysync/job) are on `store` itself.
        self._gloo = dist.ProcessGroupGloo(dist.PrefixStore("gloo/", store), rank, size, timeout)
        self._register_backend(torch.device("cpu"), ProcessGroup.BackendType.GLOO, self._gloo)
        self._set_default_backend(ProcessGroup.BackendType.GLOO)
        if torch.cuda.is_available() and dist.is_nccl_available():
            nccl_options = dist.ProcessGroupNCCL.Options()
            nccl_options._timeout = timeout
            nccl = dist.ProcessGroupNCCL(dist.PrefixStore("nccl/", store), rank, size,
                                         nccl_options)
            self._register_backend(torch.device("cuda"), ProcessGroup.BackendType.NCCL, nccl)
        assert options.inventory is not None and options.scale is not None
        # The admission's waits and the transport's dead_after: the group's timeout, but no
        # more than attach's default (torch's default of 30 min would leave a rank waiting
        # that long on a switch that is gone).
        self._admitted = admit(store, rank, size, options.inventory, host=options.host,
                               mode=options.mode or "sync", policy=options.policy,
                               scale=options.scale,
                               timeout=min(timeout.total_seconds(), DEFAULT_TIMEOUT),
                               token_file=options.token_file,
                               ranks_per_host=options.ranks_per_host)
        self.worker = self._admitted.training  # None at a host's ranks other than its leader
        self.host = self._admitted.host
        # the leader's calls through the switch: the transport keeps each key's residual
        self._member = None if self.worker is None else HySyncHookState(self.worker)
        self.job_id: int = self._admitted.job["job_id"]
        self._closed = False

    def getBackendName(self) -> str:  # noqa: N802 - torch's name for it
        return NAME

    def name(self) -> str:
        return NAME

    def allreduce(self, tensors: list[torch.Tensor],
                  opts: dist.AllreduceOptions | None = None) -> Work:
        opts = opts if opts is not None else dist.AllreduceOptions()
        if isinstance(tensors, torch.Tensor):  # pg.allreduce(tensor) as well as [tensor]
            tensors = [tensors]
        op = opts.reduceOp
        if len(tensors) != 1:
            raise ValueError(f"the hysync backend all-reduces one tensor per call, got "
                             f"{len(tensors)}: one process per device")
        tensor = tensors[0]
        exact = not (op == dist.ReduceOp.SUM or op == dist.ReduceOp.AVG) \
            or tensor.dtype not in FLOAT_DTYPES
        if exact:
            if self.options.exact_ops == "gloo":
                backend = self._get_backend(tensor.device)
                return backend.allreduce(tensors, opts)
            what = f"{_op_name(op)} of a {str(tensor.dtype).removeprefix('torch.')} tensor"
            raise ValueError(f"the hysync backend all-reduces {SUPPORTED}, got {what}; "
                             f"{EXACT_OPS_ENV}=gloo sends the others to gloo")
        if tensor.device.type not in ("cpu", "cuda"):
            raise ValueError(f"the hysync backend all-reduces CPU and CUDA tensors, got one "
                             f"on {tensor.device}")
        if tensor.numel() == 0:  # nothing to send: the transport has no empty keys
            done = torch.futures.Future()
            done.set_result([tensor])
            return HySyncWork(done)
        scale = self.size() if op == dist.ReduceOp.SUM else 1
        if self.host is not None:
            return self._host_allreduce(tensor, scale)
        assert self.worker is not None
        in_place = tensor.dtype == torch.float32 and tensor.is_contiguous()
        # One key per size: see the module's doc. A call nobody waits for asynchronously
        # (dist.all_reduce without async_op) runs on the caller's thread where it can.
        future = self.worker.allreduce_async(tensor, key=size_key(tensor.numel()),
                                             in_place=in_place, blocking=not opts.asyncOp)

        def finish(fut: torch.futures.Future) -> list[torch.Tensor]:
            result = fut.value()  # the switch's mean; a failed call raises here
            if not in_place:
                tensor.copy_(result)
            if scale != 1:
                tensor.mul_(scale)
            return [tensor]

        return HySyncWork(future.then(finish))

    def _host_allreduce(self, tensor: torch.Tensor, scale: int) -> Work:
        """The host's ranks reduce onto its leader, which sends their mean through the
        switch; its result comes back to every rank (hysync/host_group.py)."""
        assert self.host is not None
        work = tensor if tensor.dtype == torch.float32 and tensor.is_contiguous() else \
            tensor.detach().to(torch.float32, copy=True).contiguous()
        switch = None if self._member is None else switch_call(
            self._member, size_key(tensor.numel()))
        future = self.host.allreduce(work, switch)

        def finish(fut: torch.futures.Future) -> list[torch.Tensor]:
            fut.value()  # a failed call raises here
            if work is not tensor:
                tensor.copy_(work)
            if scale != 1:
                tensor.mul_(scale)
            return [tensor]

        return HySyncWork(future.then(finish))

    def shutdown(self) -> None:
        """Leave the job, wait for the other ranks, release it (rank 0), close the worker."""
        if self._closed:
            return
        self._closed = True
        admitted = self._admitted
        try:
            if admitted.serve is not None:  # a switch member: the rank or its host's leader
                member = self.rank() if self.host is None else self.host.layout.host
                admitted.serve.request({"op": "leave", "job": self.job_id, "worker": member,
                                        "key": admitted.job.get("key")})
            # Rank 0 releases the job only once every rank has left it: a rank still
            # waiting for its last result must get it from the switch.
            self._gloo.barrier().wait()
            if self.rank() == 0:
                assert admitted.serve is not None  # rank 0 leads its host
                admitted.serve.request({"op": "release"})
        finally:
            if admitted.serve is not None:
                admitted.serve.close()
            if self.worker is not None:
                self.worker.close()
            if self.host is not None:
                self.host.close()


# The collectives that go to the inner groups. torch's Python ProcessGroup calls its C++
# base, and so the inner gloo group's enqueue, with the GIL held; gloo's worker thread
# takes its work lock and then the GIL to free a finished work's tensors, and the two wait
# on each other for ever (seen as a rank stuck in dist.barrier or all_gather one run in
# a few on a busy machine). Through the inner group's own Python binding the GIL is let go
# before gloo's lock is taken, so each is forwarded there.
FORWARDED = {name: name for name in (
    "broadcast", "allgather", "_allgather_base", "allgather_coalesced", "allreduce_coalesced",
    "reduce", "reduce_scatter", "_reduce_scatter_base", "gather", "scatter", "alltoall",
    "alltoall_base", "send", "recv", "recv_anysource", "barrier")}
# the group's names for the single-tensor forms, and the inner groups' names for them
FORWARDED |= {"all_gather_single": "_allgather_base",
              "reduce_scatter_single": "_reduce_scatter_base",
              "all_to_all_single": "alltoall_base"}


def size_key(numel: int) -> str:
    """The key of an all-reduce of `numel` elements: one key per size (the module's doc)."""
    return f"allreduce/{numel}"


def _first_tensor(value: object) -> torch.Tensor | None:
    if isinstance(value, torch.Tensor):
        return value
    if isinstance(value, (list, tuple)):
        for item in value:
            found = _first_tensor(item)
            if found is not None:
                return found
    return None


def _forwarded(name: str, inner: str) -> Callable[..., Work]:
    def forward(self: HySyncProcessGroup, *args: object, **kwargs: object) -> Work:
        tensor = _first_tensor(args)
        if tensor is not None:
            device = tensor.device
        else:  # barrier: the device its options name, else the CPU's group
            opts = kwargs.get("opts", args[0] if args else None)
            device = getattr(opts, "device", None) or torch.device("cpu")
        return getattr(self._get_backend(device), inner)(*args, **kwargs)
    forward.__name__ = name
    return forward


for _name, _inner in FORWARDED.items():
    setattr(HySyncProcessGroup, _name, _forwarded(_name, _inner))


def _op_name(op: object) -> str:
    for name in ("SUM", "AVG", "PRODUCT", "MIN", "MAX", "BAND", "BOR", "BXOR", "PREMUL_SUM"):
        if op == getattr(dist.ReduceOp, name):
            return name
    return str(op)


def _create(options: _DistributedBackendOptions,
            pg_options: Options | None) -> HySyncProcessGroup:
    if pg_options is not None and not isinstance(pg_options, Options):
        raise TypeError(f"the hysync backend takes pg_options=hysync.backend.Options(...), "
                        f"got {type(pg_options).__name__}")
    return HySyncProcessGroup(options.store, options.group_rank, options.group_size,
                              options.timeout, pg_options)


def register() -> None:
    """Make "hysync" a torch.distributed backend name (done when this module is imported)."""
    if NAME.upper() not in dist.Backend._plugins:  # type: ignore[attr-defined]
        dist.Backend.register_backend(NAME, _create, extended_api=True, devices=["cpu", "cuda"])


register()
