"""Ranks that share a host: reduced there first, one switch member per host.

A job whose hosts run several ranks each (torchrun `--nproc-per-node N` on every host,
with `ranks_per_host="local"` or HYSYNC_RANKS_PER_HOST=local) makes only each host's
leader, its local rank 0, a member of the switch; the member's `worker_id` is the host's
index. Every all-reduce then goes

    reduce the host's ranks onto the leader  (gloo for CPU tensors, NCCL for CUDA ones)
    the leader: host sum / ranks per host -> the switch -> the applied mean
    broadcast the leader's result, and what it applied, to the host's ranks

so every rank of a host applies exactly what its leader applied, partial and async
rounds included, and the switch sees one contribution per host: counted once, or carried
whole by the leader's residual. The leader sends the host's *mean*, not its sum: the
values the quantizer sees stay in the range of one rank's gradients, and the switch's
mean over hosts of host means is the mean over every rank, because every host runs the
same number of ranks (a job whose hosts differ is refused at the start).

Each host's ranks get two process groups of their own, built from the job's store under
a prefix of their own: one for the reduces, issued by the caller in call order, one for
the broadcasts, issued by the host's lane thread in the same order, so the two never
interleave differently on two ranks.
"""

from __future__ import annotations

import json
import os
import time
from collections.abc import Callable, Mapping
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass, field
from datetime import timedelta

import torch
import torch.distributed as dist

from hysync import wire

RANKS_PER_HOST_ENV = "HYSYNC_RANKS_PER_HOST"
LOCAL = "local"  # the hosts torchrun launched: GROUP_RANK names one, LOCAL_RANK a place
STORE_PREFIX = "hysync/host"
# what the leader broadcasts after each call: ok, updates applied, needs resync
META = 3


class HostLayoutError(ValueError):
    """The job's ranks cannot be grouped into hosts as asked; the message says what to fix."""


@dataclass(frozen=True, slots=True)
class HostLayout:
    """Where one rank sits: its host (= its leader's worker_id) and its place there."""

    hosts: int
    ranks_per_host: int
    host: int
    local_rank: int
    # The job's ranks on this host, the leader's first (serve names the member by them).
    ranks: tuple[int, ...] = field(default=(), compare=False)

    @property
    def leader(self) -> bool:
        return self.local_rank == 0


@dataclass(frozen=True, slots=True)
class Applied:
    """What the leader's switch call applied, as every rank of its host learns it."""

    updates: float  # see HySyncWorker.updates_applied
    needs_resync: bool


@dataclass(slots=True)
class HostTimings:
    """Seconds a host's rank spent in its all-reduces, by part, summed over `calls`: the
    host level (the reduce onto the leader, the broadcasts back) and the leader's switch
    call. The reduce's time includes waiting for the host's slowest rank to arrive."""

    calls: int = 0
    reduce_s: float = 0.0
    switch_s: float = 0.0
    broadcast_s: float = 0.0

    @property
    def host_level_s(self) -> float:
        return self.reduce_s + self.broadcast_s

    def to_dict(self) -> dict[str, float]:
        return {"calls": self.calls, "reduce_s": round(self.reduce_s, 6),
                "switch_s": round(self.switch_s, 6), "broadcast_s": round(self.broadcast_s, 6)}


def ranks_per_host_setting(value: int | str | None) -> int | str:
    """`value`, else HYSYNC_RANKS_PER_HOST, else 1 (every rank its own switch member)."""
    if value is None:
        value = os.environ.get(RANKS_PER_HOST_ENV, "1")
    if isinstance(value, str) and value != LOCAL:
        try:
            value = int(value)
        except ValueError:
            value = 0
    if value != LOCAL and (isinstance(value, bool) or not isinstance(value, int) or value < 1):
        raise HostLayoutError(f"ranks_per_host ({RANKS_PER_HOST_ENV}) is a number of ranks "
                              f"per host or 'local' (torchrun's --nproc-per-node), got {value!r}")
    return value


def host_layout(store: dist.Store, rank: int, world: int, setting: int | str,
                timeout: float, env: Mapping[str, str] = os.environ) -> HostLayout | None:
    """This rank's host, or None where every host runs one rank (each rank is then a
    switch member, as without this module). Every rank of the job calls it together;
    `env` is where torchrun's variables are read ("local")."""
    if setting == LOCAL:
        layout = _local_layout(store, rank, world, timeout, env)
    else:
        assert isinstance(setting, int)
        if world % setting:
            raise HostLayoutError(f"ranks_per_host={setting} does not divide the job's {world} "
                                  "ranks: every host must run the same number of ranks")
        host = rank // setting
        layout = HostLayout(world // setting, setting, host, rank % setting,
                            tuple(range(host * setting, (host + 1) * setting)))
    if layout.hosts > wire.MAX_WORKERS:
        raise HostLayoutError(
            f"the job has {layout.hosts} switch members ({world} ranks, "
            f"{layout.ranks_per_host} per host) and one switch aggregates at most "
            f"{wire.MAX_WORKERS} (its contributor bitmap is {wire.MAX_WORKERS} bits): run more "
            "ranks per host (ranks_per_host / HYSYNC_RANKS_PER_HOST)")
    return None if layout.ranks_per_host == 1 else layout


def _local_layout(store: dist.Store, rank: int, world: int, timeout: float,
                  env: Mapping[str, str]) -> HostLayout:
    """Hosts as torchrun launched them (one agent per host, `--nproc-per-node` ranks each):
    GROUP_RANK names the host, LOCAL_RANK the rank's place on it; every rank publishes
    its own through the store and reads everyone's, so every rank refuses the same job."""
    try:
        mine = {"node": int(env["GROUP_RANK"]), "local": int(env["LOCAL_RANK"])}
    except (KeyError, ValueError):
        raise HostLayoutError("ranks_per_host='local' reads torchrun's GROUP_RANK and "
                              "LOCAL_RANK: launch with torchrun, or give the number of ranks "
                              "per host") from None
    store.set(f"{STORE_PREFIX}/rank/{rank}", json.dumps(mine))
    keys = [f"{STORE_PREFIX}/rank/{r}" for r in range(world)]
    store.wait(keys, timedelta(seconds=timeout))
    nodes: dict[int, dict[int, int]] = {}  # node -> local rank -> global rank
    for r, key in enumerate(keys):
        entry = json.loads(store.get(key))
        nodes.setdefault(entry["node"], {})[entry["local"]] = r
    sizes = {node: len(ranks) for node, ranks in sorted(nodes.items())}
    if len(set(sizes.values())) > 1:
        which = ", ".join(f"node {n}: {s}" for n, s in sizes.items())
        raise HostLayoutError(f"hosts run different numbers of ranks ({which}): HySync "
                              "averages over hosts, so start the same --nproc-per-node on "
                              "every host")
    size = sizes[mine["node"]]
    if size == 1:
        return HostLayout(world, 1, rank, 0)
    # hosts in the order of their lowest rank: rank 0's host is host 0, its leader rank 0
    order = sorted(nodes, key=lambda n: min(nodes[n].values()))
    if sorted(nodes[mine["node"]]) != list(range(size)) or nodes[order[0]].get(0) != 0:
        raise HostLayoutError("torchrun's LOCAL_RANKs of a host must be 0..N-1 and rank 0 "
                              "a host's local rank 0: launch with torchrun's defaults")
    ranks = tuple(r for _, r in sorted(nodes[mine["node"]].items()))
    return HostLayout(len(nodes), size, order.index(mine["node"]), mine["local"], ranks)


class HostGroup:
    """The collectives among one host's ranks: reduce onto the leader, broadcast back."""

    def __init__(self, store: dist.Store, layout: HostLayout, timeout: float) -> None:
        self.layout = layout
        prefix = f"{STORE_PREFIX}/{layout.host}/"
        span = timedelta(seconds=timeout)
        rank, size = layout.local_rank, layout.ranks_per_host

        def groups(device: str) -> tuple[dist.ProcessGroup, dist.ProcessGroup]:
            made = []
            for lane in ("reduce", "broadcast"):
                lane_store = dist.PrefixStore(f"{prefix}{device}/{lane}/", store)
                if device == "cpu":
                    made.append(dist.ProcessGroupGloo(lane_store, rank, size, span))
                else:
                    options = dist.ProcessGroupNCCL.Options()
                    options._timeout = span
                    made.append(dist.ProcessGroupNCCL(lane_store, rank, size, options))
            return made[0], made[1]

        self._groups = {"cpu": groups("cpu")}
        if torch.cuda.is_available() and dist.is_nccl_available():
            self._groups["cuda"] = groups("cuda")
        # The broadcasts, one call at a time in call order (see the module's doc).
        self._lane = ThreadPoolExecutor(max_workers=1, thread_name_prefix="hysync-host")
        self.timings = HostTimings()  # written by the lane thread only

    def allreduce(self, tensor: torch.Tensor,
                  switch: Callable[[torch.Tensor], Applied] | None) -> torch.futures.Future:
        """Start the host-level all-reduce of `tensor`, in place: the future holds what the
        leader applied (Applied), once `tensor` holds its result. `switch` (the leader's,
        None elsewhere) takes the host's mean and leaves the applied result in it."""
        if tensor.device.type not in self._groups:
            raise ValueError(f"a host's ranks reduce CPU and CUDA tensors, got one on "
                             f"{tensor.device}")
        reduce_group, broadcast_group = self._groups[tensor.device.type]
        options = dist.ReduceOptions()
        options.reduceOp = dist.ReduceOp.SUM
        options.rootRank = 0
        reduced = reduce_group.reduce([tensor], options)  # issued now, in call order
        future: torch.futures.Future = torch.futures.Future(
            devices=[tensor.device] if tensor.device.type == "cuda" else None)
        leader, size = self.layout.leader, self.layout.ranks_per_host

        def finish() -> None:
            timings = self.timings
            try:
                begin = time.perf_counter()
                reduced.wait()
                meta = torch.zeros(META, dtype=torch.float64, device=tensor.device)
                failure: BaseException | None = None
                reduced_at = time.perf_counter()
                if leader:
                    assert switch is not None
                    tensor.div_(size)
                    try:
                        applied = switch(tensor)
                        meta[0], meta[1], meta[2] = 1.0, applied.updates, applied.needs_resync
                    except BaseException as err:  # noqa: BLE001 - told to the host, then raised
                        failure = err
                switched_at = time.perf_counter()
                timings.calls += 1
                timings.reduce_s += reduced_at - begin
                timings.switch_s += switched_at - reduced_at
                broadcast(broadcast_group, meta)
                if failure is not None:
                    raise failure
                if meta[0].item() != 1.0:
                    raise RuntimeError(f"the host's leader (host {self.layout.host}'s local "
                                       "rank 0) failed its all-reduce through the switch: "
                                       "its output says why")
                broadcast(broadcast_group, tensor)
                timings.broadcast_s += time.perf_counter() - switched_at
                future.set_result(Applied(float(meta[1].item()), bool(meta[2].item())))
            except BaseException as err:  # noqa: BLE001 - handed to the waiting caller
                future.set_exception(err)

        self._lane.submit(finish)
        return future

    def close(self) -> None:
        self._lane.shutdown(wait=True)


def broadcast(group: dist.ProcessGroup, tensor: torch.Tensor) -> None:
    options = dist.BroadcastOptions()
    options.rootRank = 0
    group.broadcast([tensor], options).wait()
