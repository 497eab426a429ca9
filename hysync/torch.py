"""HySync in a user's training script: one call after `init_process_group`.

    import hysync.torch
    dist.init_process_group("gloo")                # as torchrun sets it up
    model = DistributedDataParallel(net)
    job = hysync.torch.attach(model, inventory="rack.toml")
    for step in job.steps(1000):                   # until the *job* applied 1000 updates
        ...forward, backward, optimizer step...

`attach` finds which inventory host it runs on (the host whose address it can bind,
or HYSYNC_HOST), reserves a UDP port there, publishes the address through the process
group's store, and rank 0 asks `hysync serve` (the inventory's `serve.listen`) to admit
the job: job id and slots come from the switch's pool, so jobs never collide (across
leaves and a spine, from every switch's, and each member sends to its host's leaf with
its worker id there, as the admit's reply places it). Rank 0's
connection to the serve is the job's lease: when the script ends, or crashes, the
serve removes the job. Every rank then registers the HySync DDP communication hook.
Where the serve asks for a token, every rank presents the one in `token_file`, else
$HYSYNC_SERVE_TOKEN_FILE, else the inventory's serve.token_file, and over mutual TLS the
inventory's serve.client_cert; the other ranks act on
the job with the key rank 0's admit returned.

With `ranks_per_host` (or HYSYNC_RANKS_PER_HOST), hosts that run several ranks each
are one switch member per host: the ranks of a host reduce there first, the host's leader
(local rank 0) sends the host's mean through the switch, and its result is broadcast
back (hysync/host_group.py). "local" takes the hosts as torchrun launched them
(`--nproc-per-node N` on every host); the default, 1, makes every rank a member.

A job installed from a job file (by the operator, `hysync job add`; across leaves and a
spine, `hysync --inventory FILE job add`) is joined without serve: `attach(model,
inventory=..., job_file="job.toml")` makes each rank one member of the file (rank r the
r-th by leaf, then worker id, or the one `member` / HYSYNC_MEMBER names, `LEAF:WORKER`),
bound to the member's address and sending to its switch: behind a leaf, that leaf, with
the member's worker id there (docs/protocol.md §11, "What a host does"). When its
training is done it leaves the job through its switches itself
(controlplane/testbed/member_leave.py): excluded at its leaf, and its leaf at the spine
once the leaf's last host is done.

`steps(n)` counts the job's clock, not the local iterations: in partial or async mode
a straggler applies several rounds in one call, and every replica stops at the same
round. A rank that is done leaves the job (the others' rounds stop waiting for it),
waits for the others, and rank 0 releases the job.
"""

from __future__ import annotations

import contextlib
import json
import logging
import os
import socket
from collections.abc import Callable, Iterator
from dataclasses import dataclass
from datetime import timedelta
from pathlib import Path

import torch
import torch.distributed as dist
from torch.nn.parallel import DistributedDataParallel

from hysync import logs
from hysync.controlplane.errors import ControlPlaneError, JobConfigError
from hysync.controlplane.job import JobConfig
from hysync.controlplane.serve.auth import TOKEN_ENV, inventory_client_context, read_token
from hysync.controlplane.serve.client import ServeClient, ServeError
from hysync.controlplane.testbed.inventory import Host, Inventory, InventoryError
from hysync.controlplane.testbed.job_member import MEMBER_ENV, job_member
from hysync.controlplane.testbed.member_leave import LeaveReport, leave
from hysync.host_group import (
    HostGroup,
    HostLayoutError,
    host_layout,
    ranks_per_host_setting,
)
from hysync.worker.api import DEFAULT_SCALE, HySyncWorker
from hysync.worker.averaging import BackgroundAverager
from hysync.worker.ddp_hook import (
    HostHookState,
    HySyncHookState,
    hysync_hook,
    hysync_host_hook,
)
from hysync.worker.transport import TransportConfig

STORE_PREFIX = "hysync"
log = logging.getLogger(__name__)
DEFAULT_TIMEOUT = 120.0  # seconds: the admission's waits and the transport's dead_after
LEAF_DRAIN_S = 10.0  # seconds a rank behind a leaf retries its unsettled flights before it leaves


class AttachError(RuntimeError):
    """The script cannot join HySync as configured; the message says what to fix."""


class HySyncJob:
    """A rank's handle on its HySync job: the worker, the hook state, the job's clock.
    On a host of several ranks, only its leader has a worker and a connection to the
    serve (`worker` and `serve` are None elsewhere), and `host` is its host's group."""

    def __init__(self, rank: int, world: int, job: dict, worker: HySyncWorker | None,
                 state: HySyncHookState | HostHookState, serve: ServeClient | None,
                 averaging: tuple[HySyncWorker, list[torch.Tensor], float] | None,
                 host: HostGroup | None = None,
                 leave: Callable[[], LeaveReport] | None = None) -> None:
        self.rank, self.world = rank, world
        self.host = host
        self.job_id: int = job["job_id"]
        self.key: str | None = job.get("key")  # the admit's: this rank acts on the job
        self.slots = (job["slot_base"], job["slot_base"] + job["slot_count"] - 1)
        self.worker, self.state, self.serve = worker, state, serve
        self._leave = leave  # an installed job's member leaves through its switches
        self._averaging = averaging  # (worker, parameters, period): started by steps()
        self.averager: BackgroundAverager | None = None
        self.updates = 0.0  # the job's clock: all-member updates applied at this replica
        self.local_steps = 0  # this rank's own iterations
        self._closed = False

    def steps(self, n: int) -> Iterator[int]:
        """Yield local step numbers until the job has applied `n` updates, then finish.
        With background averaging, its moves are applied between two steps, and every
        optimizer step holds the averager off the parameters (only those: a step blocked
        in a gradient call must not stop the other replicas' averaging)."""
        if self._averaging is not None and self.averager is None:
            worker, params, period = self._averaging
            training = self.worker
            assert training is not None  # averaging runs with one rank per host
            self.averager = BackgroundAverager(
                worker, params, period_s=period, steps=n,
                needs_resync=lambda: training.needs_resync,
                clear_resync=training.transport.clear_resync,
                uneven_calls=lambda: training.uneven_calls)
        with (self.averager.optimizer_steps_hold_lock() if self.averager
              else contextlib.nullcontext()):
            while True:
                if self.averager is not None:
                    self.updates = self.averager.at_step(self.updates)
                if self.updates >= n - 1e-9:
                    break
                calls = self.state.stats.calls
                yield self.local_steps
                self.local_steps += 1
                if self.state.stats.calls > calls:  # a backward ran the hook: the clock moved
                    self.updates += self.state.updates_applied()
        self.finish()

    def finish(self) -> None:
        """Leave the job, run the final averaging round, wait for every rank, and (rank 0)
        release the job."""
        if self._closed:
            return
        self._drain_behind_leaf()
        if self.serve is not None:  # an admitted job's member: the rank, or its host's leader
            member = self.rank if self.host is None else self.host.layout.host
            self.serve.request({"op": "leave", "job": self.job_id, "worker": member,
                                "key": self.key})
        elif self._leave is not None:
            try:
                log.info("%s", self._leave().text(self.job_id))
            except ControlPlaneError as err:
                # Training is done and every update applied: a leave the switches refuse
                # (no route to their P4Runtime, a writer-only switch) costs the members still
                # finishing a wait of dead_after, not this rank's result.
                log.warning("job %d: could not leave the switches (%s); members still "
                            "finishing wait for this one until their dead_after",
                            self.job_id, err)
        if self.averager is not None:
            self.averager.finish(self.updates)
        dist.barrier()
        self.close()

    def _drain_behind_leaf(self) -> None:
        """Behind a leaf, a host's retries are what move its leaf's pending sum and held
        round (docs/protocol.md §11, "What a host does"): its flights keep retrying until
        settled before it leaves. Bounded well under dead_after: a round that still waits
        then waits on members that are gone, and leaving is what releases it."""
        if self.worker is None or not self.worker.transport.config.behind_leaf:
            return
        left = self.worker.transport.finish(timeout=LEAF_DRAIN_S).in_flight
        if left:
            log.warning("job %d: %d packet(s) still unsettled after %.0f s of retries at the "
                        "end; leaving the job releases the rounds that wait on them",
                        self.job_id, left, LEAF_DRAIN_S)

    def close(self) -> None:
        if self._closed:
            return
        self._closed = True
        if self.rank == 0 and self.serve is not None:  # an admitted job: rank 0 holds it
            self.serve.request({"op": "release"})
        if self.serve is not None:
            self.serve.close()
        if self.worker is not None:
            self.worker.close()
        if self.host is not None:
            self.host.close()
        if self.averager is not None:
            self.averager.close()
        elif self._averaging is not None:
            self._averaging[0].close()


def find_host(inv: Inventory, name: str | None = None) -> Host:
    """The inventory host this process runs on: `name`, HYSYNC_HOST, or the one host whose
    IPv4 address a socket here can bind."""
    name = name or os.environ.get("HYSYNC_HOST")
    if name:
        try:
            host = inv.host(name)
        except InventoryError as err:
            raise AttachError(str(err)) from None
        try:
            socket.if_nametoindex(host.interface)
        except OSError:
            raise AttachError(f"host {name} of {inv.path} has its data on interface "
                              f"{host.interface!r}, which this machine lacks: fix hosts."
                              "interface in the inventory, or HYSYNC_HOST") from None
        return host
    local = []
    for host in inv.hosts:
        with socket.socket(socket.AF_INET, socket.SOCK_DGRAM) as probe:
            try:
                probe.bind((host.ipv4, 0))
            except OSError:
                continue
        local.append(host)
    if len(local) != 1:
        which = ", ".join(h.name for h in local) or "none"
        raise AttachError(f"cannot tell which host of {inv.path} this is (hosts with an "
                          f"address here: {which}): set HYSYNC_HOST to its name")
    return local[0]


def port_of(sock: socket.socket) -> int:
    return sock.getsockname()[1]


def _reserve_socket(ipv4: str) -> socket.socket:
    """A UDP socket bound to a free port of `ipv4`, kept until the worker takes it over: the
    port is the member's address, announced before the job exists."""
    sock = socket.socket(socket.AF_INET, socket.SOCK_DGRAM)
    sock.bind((ipv4, 0))
    return sock


@dataclass(slots=True)
class Admitted:
    """One rank's share of an admitted job: what `attach` and the `hysync` process-group
    backend (hysync/backend.py) both build on."""

    rank: int
    world: int
    job: dict  # the training job (job_id, slot_base, slot_count) and the admit's key
    serve: ServeClient | None  # a switch member's (rank 0's: the job's lease)
    training: HySyncWorker | None  # a switch member's: None at a host's other ranks
    averaging: HySyncWorker | None  # the averaging job's worker, where asked for
    host: HostGroup | None = None  # the host's group, where hosts run several ranks
    # an installed job's member (no serve): takes it out of the job at every level
    leave: Callable[[], LeaveReport] | None = None


def admit(store: dist.Store, rank: int, world: int, inventory: str | Path | Inventory, *,
          host: str | None = None, mode: str = "sync", policy: str | None = None,
          averaging: bool = False, scale: float = DEFAULT_SCALE, timeout: float = DEFAULT_TIMEOUT,
          token_file: str | Path | None = None,
          ranks_per_host: int | str | None = None, quorum: int | None = None) -> Admitted:
    """Every rank of a group calls this together: each switch member (every rank, or each
    host's leader with `ranks_per_host`) publishes its UDP address through `store`, rank
    0 asks the inventory's `hysync serve` to admit the job (with an averaging job too
    where `averaging`), and every member builds the worker(s) it sends through."""
    try:
        logs.from_environment()  # the transport's events, timestamped, where asked for
    except ValueError as err:
        raise AttachError(str(err)) from None
    try:
        inv = inventory if isinstance(inventory, Inventory) else Inventory.load(inventory)
        layout = host_layout(store, rank, world, ranks_per_host_setting(ranks_per_host),
                             timeout)
    except (InventoryError, HostLayoutError) as err:
        raise AttachError(str(err)) from None
    if layout is not None and averaging:
        raise AttachError("background averaging (average_every) runs with one rank per "
                          "host: leave it out, or set ranks_per_host to 1")
    group = None if layout is None else HostGroup(store, layout, timeout)
    if layout is not None and not layout.leader:
        return _host_member(store, rank, world, timeout, group)
    # the switch member: this rank, or its host's leader (whose worker_id is the host's)
    member, size = (rank, world) if layout is None else (layout.host, layout.hosts)
    me = find_host(inv, host)
    sock = _reserve_socket(me.ipv4)
    avg_sock = _reserve_socket(me.ipv4) if averaging else None
    port = port_of(sock)
    avg_port = port_of(avg_sock) if avg_sock else None
    # the job's ranks this member speaks for: serve's decisions and stats name them
    ranks = [rank] if layout is None else list(layout.ranks)
    store.set(f"{STORE_PREFIX}/member/{member}", json.dumps(
        {"worker": member, "host": me.name, "udp_port": port, "avg_udp_port": avg_port,
         "ranks": ranks}))
    token_file = token_file or os.environ.get(TOKEN_ENV) or inv.access.token_file
    try:
        token = read_token(token_file, "the serve's token file") if token_file else None
        tls = inventory_client_context(inv.access)
    except ServeError as err:
        raise AttachError(str(err)) from None
    serve = ServeClient(inv.serve, timeout=timeout, token=token, tls=tls)
    if rank == 0:
        keys = [f"{STORE_PREFIX}/member/{m}" for m in range(size)]
        store.wait(keys, timedelta(seconds=timeout))
        members = [json.loads(store.get(k)) for k in keys]
        run_id = os.environ.get("TORCHELASTIC_RUN_ID", "none")
        request = {"op": "admit", "name": "torchrun" if run_id == "none" else run_id,
                   "members": members, "mode": mode}
        if policy is not None:
            request["policy"] = policy
        if quorum is not None:  # partial mode's: members a round waits for
            request["quorum"] = quorum
        reply = serve.request(request)
        # The lease survives serve restarts.
        serve.hold([j["job_id"] for j in reply["jobs"]], reply.get("key"))
        store.set(f"{STORE_PREFIX}/job", json.dumps(reply))
    store.wait([f"{STORE_PREFIX}/job"], timedelta(seconds=timeout))
    reply = json.loads(store.get(f"{STORE_PREFIX}/job"))
    # Across leaves and a spine the reply places each member behind its leaf, with its
    # worker id there; on one switch every member sends to the switch as its rank.
    place = reply.get("placement", {}).get(str(member))
    switch = place or reply["switch"]
    worker_id = member if place is None else place["worker"]

    def worker(job: dict, sock: socket.socket) -> HySyncWorker:
        config = TransportConfig(
            job_id=job["job_id"], worker_id=worker_id, switch_host=switch["ipv4"],
            switch_port=switch["udp_port"], bind_host=me.ipv4, bind_port=port_of(sock),
            bind_fd=sock.fileno(), slot_base=job["slot_base"], slot_count=job["slot_count"],
            members=reply.get("members", size), dead_after=timeout,
            install_tag=job.get("install_tag", -1), behind_leaf=place is not None)
        sock.detach()  # the transport owns the descriptor from here
        return HySyncWorker(config, scale=scale)

    training = worker(reply["jobs"][0], sock)
    avg_worker = worker(reply["jobs"][1], avg_sock) if avg_sock is not None else None
    return Admitted(rank, world, dict(reply["jobs"][0], key=reply.get("key")), serve,
                    training, avg_worker, group)


def join_installed(rank: int, world: int, inventory: str | Path | Inventory,
                   job_file: str | Path, *, member: str | None = None,
                   scale: float = DEFAULT_SCALE, timeout: float = DEFAULT_TIMEOUT) -> Admitted:
    """A rank's share of a job already installed from `job_file` (no serve): it is the
    member `member` names (or $HYSYNC_MEMBER, or the rank-th), binds that member's address
    and sends to its switch: across switches its leaf, with its worker id there."""
    try:
        logs.from_environment()
    except ValueError as err:
        raise AttachError(str(err)) from None
    try:
        inv = inventory if isinstance(inventory, Inventory) else Inventory.load(inventory)
        job = JobConfig.load(job_file)
        me = job_member(inv, job, rank, world, member or os.environ.get(MEMBER_ENV) or None)
    except (InventoryError, JobConfigError) as err:
        raise AttachError(str(err)) from None
    address = (me.member.ipv4, me.member.udp_port)
    sock = socket.socket(socket.AF_INET, socket.SOCK_DGRAM)
    try:
        sock.bind(address)
    except OSError as err:
        sock.close()
        raise AttachError(f"member {me.name} of {job_file} cannot bind its address "
                          f"{address[0]}:{address[1]} ({err.strerror}): run it on the host "
                          "of that address, with the port free, or fix its [[members]] "
                          "entry") from None
    config = TransportConfig(
        job_id=job.job_id, worker_id=me.member.worker, switch_host=me.switch.data_ipv4,
        switch_port=me.switch.data_udp_port, bind_host=address[0], bind_port=address[1],
        bind_fd=sock.fileno(), slot_base=job.slot_base, slot_count=job.slot_count,
        members=me.members, dead_after=timeout, behind_leaf=me.behind_leaf)
    sock.detach()  # the transport owns the descriptor from here
    training = HySyncWorker(config, scale=scale)
    return Admitted(rank, world, {"job_id": job.job_id, "slot_base": job.slot_base,
                                  "slot_count": job.slot_count, "key": None},
                    None, training, None, leave=lambda: leave(inv, job, me, wait=timeout))


def _host_member(store: dist.Store, rank: int, world: int, timeout: float,
                 group: HostGroup | None) -> Admitted:
    """A rank of a host that is not its leader: no socket, no worker, no serve connection;
    it learns the admitted job from the store, as the members do."""
    store.wait([f"{STORE_PREFIX}/job"], timedelta(seconds=timeout))
    reply = json.loads(store.get(f"{STORE_PREFIX}/job"))
    return Admitted(rank, world, dict(reply["jobs"][0], key=reply.get("key")), None, None,
                    None, group)


def attach(model: DistributedDataParallel, *, inventory: str | Path | Inventory,
           host: str | None = None, mode: str = "sync", policy: str | None = None,
           average_every: float | None = None, scale: float = DEFAULT_SCALE,
           timeout: float = DEFAULT_TIMEOUT, token_file: str | Path | None = None,
           ranks_per_host: int | str | None = None, quorum: int | None = None,
           job_file: str | Path | None = None, member: str | None = None) -> HySyncJob:
    """Join HySync: admit the job (rank 0), register the DDP hook (every rank). With
    `average_every` seconds, the replicas' parameters are also averaged in the
    background through the switch, on a second job (worker/averaging.py). With
    `ranks_per_host` ("local": torchrun's hosts; a number: that many consecutive ranks
    per host), each host's ranks reduce there first and its leader is the switch member.
    `quorum`: the members (hosts) a partial round waits for, where `mode` is "partial".

    With `job_file`, the job is the one installed from that file (`hysync job add`; across
    leaves and a spine `hysync --inventory FILE job add`) and no serve is asked: each rank
    is one member of it (`member`, $HYSYNC_MEMBER, or the rank-th; join_installed), its
    mode is the job file's and the operator's (`hysync mode set`), a rank that is done
    leaves the job at every level (member_leave.py; where the switches refuse it, a
    warning), and the operator removes the job when training is done."""
    if not dist.is_initialized():
        raise AttachError("call torch.distributed.init_process_group before "
                          "hysync.torch.attach (torchrun sets up its environment)")
    if job_file is not None:
        admission = {"host": host, "policy": policy, "average_every": average_every,
                     "token_file": token_file, "ranks_per_host": ranks_per_host,
                     "quorum": quorum, "mode": None if mode == "sync" else mode}
        given = [name for name, value in admission.items() if value is not None]
        if given:
            raise AttachError(f"{', '.join(given)} with job_file: those are serve's "
                              "admission settings; an installed job takes its members and "
                              "mode from the job file (and `hysync mode set`): leave them out")
        admitted = join_installed(dist.get_rank(), dist.get_world_size(), inventory, job_file,
                                  member=member, scale=scale, timeout=timeout)
    else:
        if member is not None:
            raise AttachError("member names a member of a job file: pass job_file too, or "
                              "leave member out (serve admits the ranks as they come)")
        # The process group's store (private in torch, stable since 1.x): the rendezvous
        # every rank already shares, whatever launched it.
        store = dist.distributed_c10d._get_default_store()
        admitted = admit(store, dist.get_rank(), dist.get_world_size(), inventory, host=host,
                         mode=mode, policy=policy, averaging=bool(average_every), scale=scale,
                         timeout=timeout, token_file=token_file,
                         ranks_per_host=ranks_per_host, quorum=quorum)
    averaging = None
    if admitted.averaging is not None:
        averaging = (admitted.averaging, list(model.module.parameters()), average_every)
    if admitted.host is None:
        assert admitted.training is not None
        state = HySyncHookState(admitted.training)
        model.register_comm_hook(state, hysync_hook)
        return HySyncJob(admitted.rank, admitted.world, admitted.job, admitted.training,
                         state, admitted.serve, averaging, leave=admitted.leave)
    member = None if admitted.training is None else HySyncHookState(admitted.training)
    host_state = HostHookState(admitted.host, member)
    model.register_comm_hook(host_state, hysync_host_hook)
    return HySyncJob(admitted.rank, admitted.world, admitted.job, admitted.training,
                     host_state, admitted.serve, averaging, admitted.host)
