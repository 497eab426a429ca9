"""`hysync serve INVENTORY`: the one owner of a testbed's switch.

It holds the P4Runtime primary role under the inventory's election id for as long as
it runs, so a second `serve` against the same switch is refused by the switch itself
(two streams may not share an election id). It listens on `serve.listen` (TCP or a
Unix socket) for one JSON request per line (controlplane/serve/client.py). An inventory
of leaves and a spine is served by controlplane/serve/fabric_server.py, which holds every
switch of it and places each job across them; the requests are the same:

* `admit`: a training script's job (and its model-averaging job); members are
  inventory hosts, each with the job's ranks it speaks for (a host of several ranks is
  one member, controlplane/policy/member_hosts.py); job ids and slots come from the pool,
  disjoint from live jobs', each after the last one given (wrapping), so an id names one
  job in logs for a long while;
* `claim`: take over the lease of jobs after a reconnect (a restarted serve);
* `leave`: a worker finished training (it is excluded, the policy stops);
* `release`: remove the jobs this connection admitted;
* `mode_set`, `exclude`, `readmit`, `job_add`, `job_remove`: the CLI's writes, routed
  here (`hysync --serve ADDR ...`);
* `policy_resume`: hand a job the operator set a mode of back to its policy;
* `status`: the jobs, their owners and policies, each member's host and ranks;
* `hello`: present a credential, and ask to act as the operator (controlplane/serve/auth.py).

Every request is parsed and checked by controlplane/serve/requests.py first; a bad one is
answered `{"ok": false, "error": ...}` and the connection carries on. A job belongs to the
connection that admitted it (and to the holders of its key: the script's other ranks) or
to the operator; every request that changes a job checks that its sender is one of them.

The connection that admitted a job is its lease: when it closes without `release`
(the script crashed), the job is removed and its slots return to the pool. A mode set
by the operator while a job's policy runs is applied and logged as an override, and the
policy is held: it decides nothing for the job until the operator hands it back
(`policy_resume`, `hysync --serve ADDR policy resume JOB`); it then adopts the job as it
finds it and keeps that for its minimum dwell before deciding again.

A restarted serve reads the switch's tables back (`Controller.attach`): the jobs it
finds on the inventory's hosts are kept for `claim_grace` seconds for their scripts
to reconnect and claim them with their keys (controlplane/serve/keys.py keeps the keys'
digests across the restart; the operator may claim any), then removed; slots are
given after the last one in use, so a restart never hands out a live job's slots.

A restarted *switch* ends serve's P4Runtime session. Serve then connects again, every
policy interval until the switch answers, and gives it back what serve holds: the
inventory's pipeline and forwarding where the switch has none (what `hysync deploy`
writes), then every job of a lease, as it was installed (members, exclusions, modes)
under a new install epoch. The workers learn of the new state from the switch's
replies and resynchronize (docs/protocol.md §9, "A switch that lost the job's state").
"""

from __future__ import annotations

import contextlib
import itertools
import json
import logging
import os
import secrets
import socket
import socketserver
import ssl
import threading
import time
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from hysync import logs, wire
from hysync.controlplane.controller import Controller, MembershipReport
from hysync.controlplane.errors import ControlPlaneError, NotPrimaryError
from hysync.controlplane.job import JobConfig
from hysync.controlplane.p4rt.switch import Switch
from hysync.controlplane.policy.levels import LevelPolicies
from hysync.controlplane.policy.member_hosts import MemberHost, describe, member_fields
from hysync.controlplane.policy.policies import PolicyConfig, make_policy
from hysync.controlplane.policy.runner import PolicyRunner
from hysync.controlplane.serve.auth import (
    MAX_CONNECTIONS_PER_CLIENT,
    MAX_JOBS_PER_CLIENT,
    Gate,
    Lobby,
    Peer,
)
from hysync.controlplane.serve.client import ServeError
from hysync.controlplane.serve.keys import KeyStore, default_path, digest, key_matches
from hysync.controlplane.serve.requests import LineTooLong, check, parse, read_line
from hysync.controlplane.tables.installed import InstalledJob
from hysync.controlplane.testbed.deploy import (
    compare_pipeline,
    connect,
    deploy_on,
    held,
    inventory_jobs,
)
from hysync.controlplane.testbed.inventory import Inventory, SwitchInfo
from hysync.controlplane.testbed.serve_access import parse_listen
from hysync.wire import Mode

log = logging.getLogger(__name__)

OPERATOR = -1  # owner of jobs added from the CLI: no lease, removed by hand
SERVE = 0  # the connection id of requests made in-process (serve itself: the operator)


class HelloRefused(ServeError):
    """A hello that failed, or a connection one too many: answered after `delay` seconds,
    then the connection is closed."""

    def __init__(self, text: str, delay: float = 0.0) -> None:
        super().__init__(text)
        self.delay = delay


@dataclass(slots=True)
class Lease:
    owner: int | None  # connection id; None: adopted at a restart, waiting for a claim
    deadline: float = 0.0  # unclaimed adopted jobs are removed then
    policy: PolicyRunner | LevelPolicies | None = None  # LevelPolicies: across switches
    left: set[int] = field(default_factory=set)  # workers that finished training
    held: bool = False  # an operator set the mode: the policy waits for policy_resume
    # The SHA-256 of the key shown to the admitting connection only (the script's other
    # ranks present the key); None: an adopted job whose key serve did not keep.
    key_digest: str | None = None
    client: tuple[str, object] | None = None  # who admitted it: the quota counts by it
    # member -> its host and ranks, as the admit said (empty: not admitted by a script)
    hosts: dict[int, MemberHost] = field(default_factory=dict)
    # across leaves and a spine: member -> (its leaf, its worker id there), as admitted
    placement: dict[int, tuple[str, int]] = field(default_factory=dict)


class Server:
    """The serve process's state: the primary session, the jobs' leases and policies."""

    def __init__(self, inv: Inventory, *, policy: str | None = "adaptive",
                 policy_interval: float = 0.5, policy_scale: float = 1.0,
                 policy_log: Path | None = None, claim_grace: float = 30.0,
                 timeout: float = 5.0, say: Callable[[str], None] | None = None,
                 max_connections_per_client: int = MAX_CONNECTIONS_PER_CLIENT,
                 max_jobs_per_client: int = MAX_JOBS_PER_CLIENT,
                 state_file: Path | None = None) -> None:
        self.inv = inv
        self.policy_name, self.policy_interval = policy, policy_interval
        self.policy_config = PolicyConfig().scaled(policy_scale)
        self.policy_log, self.claim_grace, self.say = policy_log, claim_grace, say
        self.timeout = timeout
        self._lost_since: float | None = None  # the switch's session ended; not back yet
        self._reconnect_error = ""  # why the last attempt to connect again failed
        self.lock = threading.RLock()  # one controller call at a time
        self.leases: dict[int, Lease] = {}
        self._ids = itertools.count(1)
        self._stop = threading.Event()
        self._threads: list[threading.Thread] = []
        self.connections: set[socket.socket] = set()  # closed by close(): clients learn it
        self.peers: dict[int, Peer] = {SERVE: Peer("serve", ("serve", 0), True, True, True)}
        self.max_connections_per_client = max_connections_per_client
        self.max_jobs_per_client = max_jobs_per_client
        self.clients: dict[tuple[str, object], int] = {}  # authenticated connections per client
        self.lobby = Lobby()  # connections not authenticated yet, failed hellos
        self._listener: socketserver.BaseServer | None = None
        # Who may connect is settled before the switch is touched: a serve that would
        # listen unprotected does not start at all.
        self.gate = Gate(inv.access, *parse_listen(inv.serve), inv.path)
        s = inv.switch
        self.keys = KeyStore(state_file or default_path(s.grpc_addr, s.device_id))
        self._open_switches()
        try:
            adopted = self._adoptable()
            for job in adopted:
                self.leases[job.job_id] = Lease(None, time.monotonic() + claim_grace,
                                                key_digest=self.keys.get(job.job_id, job.slots))
            self.keys.drop([j for j in self.keys.keys if j not in self.leases])
            self._cursor = max((j.slots[1] + 1 for j in adopted), default=inv.pool.slot_base)
            self._id_cursor = max((j.job_id + 1 for j in adopted), default=1)
            if adopted:
                self._event("adoption", f"adopted jobs {', '.join(str(j.job_id) for j in adopted)}"
                            f" from the switch; their owners have {claim_grace:g} s to claim them",
                            jobs=[j.job_id for j in adopted])
        except BaseException:
            self._close_switches()
            raise

    # ---------------------------------------------------------- the switch
    # A serve across leaves and a spine (controlplane/serve/fabric_server.py) holds every
    # switch of its fabric: these are the places where the number of switches matters.
    runs_policies = True  # a straggler policy per admitted job, where asked for

    def _open_switches(self) -> None:
        """Become the primary of the inventory's switch, check its pipeline, attach."""
        inv = self.inv
        self.switch = open_primary(inv, inv.switch, self.timeout)
        try:
            pipeline = compare_pipeline(self.switch, inv)
            if pipeline.state != "same":
                raise ServeError(f"{pipeline.detail}: run `hysync deploy {inv.path}` first")
            self.controller = Controller(self.switch, keep_macs={h.mac for h in inv.hosts},
                                         keep_ports={h.switch_port for h in inv.hosts})
            self.controller.attach()
        except BaseException:
            self.switch.close()
            raise

    def _close_switches(self) -> None:
        self.switch.close()

    def _adoptable(self) -> list[InstalledJob]:
        """The jobs found on the switch that a restarted serve keeps for a claim."""
        return inventory_jobs(self.controller, self.inv)

    def _controllers(self) -> list[Controller]:
        """Every switch's controller: job ids and slots are free where free on all."""
        return [self.controller]

    def _lost(self) -> bool:
        return self.switch.lost

    def _install(self, job: JobConfig) -> None:
        self.controller.add_job(job)

    def _uninstall(self, job_id: int) -> int:
        return self.controller.remove_job(job_id)

    def _job_config(self, job_id: int, members: list[dict[str, Any]], port_key: str, base: int,
                    count: int, mode: str, quorum: object, name: str) -> JobConfig:
        rows = []
        for m in members:
            host = self.inv.host(m["host"])
            rows.append({"worker": m["worker"], "ipv4": host.ipv4, "mac": host.mac,
                         "udp_port": m[port_key], "switch_port": host.switch_port})
        return JobConfig.from_dict(_job_table(job_id, rows, base, count, mode, quorum, name))

    def _placement(self, members: list[dict[str, Any]]) -> dict[str, Any]:
        """Where the admitted members send (the admit reply's part that says so)."""
        return {"switch": {"ipv4": self.inv.switch.data_ipv4,
                           "udp_port": self.inv.switch.data_udp_port}}

    # ---------------------------------------------------------- lifecycle
    def start(self) -> Server:
        """Listen on `serve.listen`; ServeError (and the switch let go) if it cannot."""
        kind, where = parse_listen(self.inv.serve)
        handler = _handler(self)
        try:
            if kind == "unix":
                assert isinstance(where, str)
                if os.path.exists(where):
                    os.unlink(where)  # we are the primary: a socket file left there is stale
                self._listener = _UnixServer(where, handler, bind_and_activate=False)
                self._listener.server_bind()
                os.chmod(where, self.inv.access.socket_mode)  # before anyone may connect
                self._listener.server_activate()
            else:
                self._listener = _TcpServer(where, handler)
                self._listener.tls = self.gate.tls
        except OSError as err:
            self._close_switches()
            raise ServeError(f"cannot listen on {self.inv.serve}: {err.strerror or err}; pick "
                             f"another serve.listen in {self.inv.path}") from None
        listener = self._listener
        # shutdown() waits for serve_forever's next poll: a short one lets Ctrl-C end serve
        # within a second.
        accept = lambda: listener.serve_forever(poll_interval=0.1)
        for target, name in ((accept, "accept"), (self._tick, "tick")):
            t = threading.Thread(target=target, daemon=True, name=f"serve-{name}")
            t.start()
            self._threads.append(t)
        return self

    @property
    def address(self) -> str:
        assert self._listener is not None
        where = self._listener.server_address
        return f"unix:{where}" if isinstance(where, str) else "{}:{}".format(*where[:2])

    def close(self) -> None:
        self._stop.set()
        if self._listener is not None:
            self._listener.shutdown()
            self._listener.server_close()
            where = self._listener.server_address
            if isinstance(where, str):  # a Unix socket's file outlives its listener
                with contextlib.suppress(FileNotFoundError):
                    os.unlink(where)
        for t in self._threads:
            t.join(timeout=5)
        with self.lock:
            for sock in list(self.connections):
                with contextlib.suppress(OSError):  # the client closed it already
                    sock.shutdown(socket.SHUT_RDWR)
            for lease in self.leases.values():
                if lease.policy is not None:
                    lease.policy.close()
        self._close_switches()

    def _tick(self) -> None:
        """Every policy interval: reconnect to a switch whose session ended, step the
        policies, drop unclaimed adopted jobs."""
        while not self._stop.wait(self.policy_interval):
            if self._lost() and not self._reconnect():
                continue
            with self.lock:
                now = time.monotonic()
                for job_id, lease in list(self.leases.items()):
                    if lease.owner is None and now >= lease.deadline:
                        self._remove([job_id], "nobody claimed it after the restart")
                    elif lease.policy is not None and not lease.held:
                        try:
                            lease.policy.step()
                        except ControlPlaneError as err:
                            logs.event(log, "policy_error", f"policy of job {job_id}: {err}",
                                       job=job_id, level=logging.WARNING, error=str(err))

    def _reconnect(self) -> bool:
        """Open a new session with a switch whose session ended and give it back what
        serve holds; False while the switch does not answer or refuses (tried again at the
        next tick). Requests meanwhile fail with P4RuntimeUnreachableError."""
        addr = self.inv.switch.grpc_addr
        if self._lost_since is None:
            self._lost_since = time.monotonic()
            self._event("switch_lost", f"the P4Runtime session with the switch at {addr} "
                        "ended (a restart, or the connection broke); connecting again",
                        level=logging.WARNING)
        try:
            switch = connect(self.inv, timeout=self.timeout)
        except ControlPlaneError as err:
            return self._not_back(err)
        try:
            report = deploy_on(switch, self.inv)
        except ControlPlaneError as err:
            switch.close()
            return self._not_back(err)
        with self.lock:
            old, self.switch = self.switch, switch
            switch.on_write = old.on_write
            self.controller.switch = switch
            old.close()
            # What serve held before the session ended: the controller's last reading.
            held_jobs = [self.controller.jobs[j] for j in sorted(self.leases)
                         if j in self.controller.jobs]
            restored = []
            for job in held_jobs:
                try:
                    if self.controller.restore_job(job).outcome == "restored":
                        restored.append(job.job_id)
                except ControlPlaneError as err:
                    self._event("job_restore_failed", f"job {job.job_id}: installing it "
                                f"again failed ({err})", job=job.job_id,
                                level=logging.WARNING, error=str(err))
            down = time.monotonic() - self._lost_since
            self._lost_since, self._reconnect_error = None, ""
            what = ("it had no pipeline: pipeline and forwarding pushed" if report.push
                    else "its pipeline is the inventory's")
            jobs = (f"jobs {', '.join(map(str, restored))} installed again (new install "
                    "epochs; their workers resynchronize)" if restored else "no job to install")
            self._event("switch_reconnected", f"the switch at {addr} is back after "
                        f"{down:.1f} s; {what}; {jobs}", jobs=restored, pushed=report.push)
        return True

    def _not_back(self, err: ControlPlaneError) -> bool:
        """Log why the switch is not back yet, each new reason once (not every tick)."""
        if str(err) != self._reconnect_error:
            self._reconnect_error = str(err)
            self._event("switch_reconnect_failed", f"the switch at "
                        f"{self.inv.switch.grpc_addr}: {err}", level=logging.WARNING,
                        error=str(err))
        return False

    # ---------------------------------------------------------- requests
    def handle(self, conn: int, request: dict[str, Any]) -> dict[str, Any]:
        """Carry out one parsed request of connection `conn`; ServeError if refused."""
        op, args = check(request)
        peer = self.peers[conn]
        if op == "hello":
            try:
                self.gate.hello(peer, args["token"], bool(args["operator"]))
            except ServeError as err:
                raise HelloRefused(str(err), self.lobby.failed(peer.client)) from None
            self.lobby.leave(peer.client, conn)
            self._count_in(conn, peer)
            return {"ok": True, "peer": peer.who, "operator": peer.operator}
        if not peer.authenticated:
            raise ServeError(self.gate.refusal())
        with self.lock:
            return dict(getattr(self, f"op_{op}")(conn, args), ok=True)

    def _owner(self, conn: int, job_id: int, what: str, key: str | None = None) -> Lease | None:
        """The lease of `job_id` if connection `conn` may `what` it: it admitted or
        claimed the job, holds its key, or is the operator. ServeError if not."""
        lease = self.leases.get(job_id)
        if self.peers[conn].operator:
            return lease
        if lease is not None and (lease.owner == conn or key_matches(key, lease.key_digest)):
            return lease
        owner = ("not this serve's" if lease is None else "the operator's"
                 if lease.owner == OPERATOR else "unclaimed" if lease.owner is None
                 else f"connection {lease.owner}'s")
        raise ServeError(f"job {job_id} is {owner}, not this connection's: only its owner or "
                         f"the operator may {what} it (the operator: hysync --serve, or "
                         "{\"op\": \"hello\", \"operator\": true})")

    def _count_in(self, conn: int, peer: Peer) -> None:
        """Count an authenticated connection against its client's limit; HelloRefused (the
        connection is closed) past it."""
        with self.lock:
            if peer.counted:
                return
            count = self.clients.get(peer.client, 0) + 1
            if count > self.max_connections_per_client:
                raise HelloRefused(f"{peer.who} has {count - 1} connections open, the most one "
                                   "client may: close one (each training script's rank holds "
                                   "one)")
            self.clients[peer.client] = count
            peer.counted = True

    def _count_out(self, peer: Peer) -> None:
        with self.lock:
            if peer.counted:
                peer.counted = False
                self.clients[peer.client] -= 1
                if not self.clients[peer.client]:
                    del self.clients[peer.client]

    def connection_closed(self, conn: int) -> None:
        if self._stop.is_set():  # serve is stopping, not the script: its jobs stay
            return
        with self.lock:
            owned = [j for j, lease in self.leases.items() if lease.owner == conn]
            if owned:
                self._remove(owned, "its training script's connection closed")

    def op_status(self, conn: int, request: dict[str, Any]) -> dict[str, Any]:
        """Every job for the operator; a client sees the jobs of its own connection."""
        jobs = []
        operator = self.peers[conn].operator
        for job in self.controller.list_jobs():
            lease = self.leases.get(job.job_id)
            if not operator and (lease is None or lease.owner != conn):
                continue
            owner = ("operator" if lease and lease.owner == OPERATOR else
                     "unclaimed" if lease and lease.owner is None else
                     f"connection {lease.owner}" if lease else "not this serve's")
            hosts = self.members_of(job.job_id)
            jobs.append(dict(job.to_dict(), owner=owner,
                             policy=bool(lease and lease.policy is not None),
                             held=bool(lease and lease.held),
                             hosts=[member_fields(m.worker, hosts) for m in job.members]))
        return {"jobs": jobs, "grpc_addr": self.inv.switch.grpc_addr}

    def op_admit(self, conn: int, request: dict[str, Any]) -> dict[str, Any]:
        peer = self.peers[conn]
        if not peer.operator:
            # a script's training and averaging jobs share one key: one job for the quota
            jobs_held = {lease.key_digest for lease in self.leases.values()
                         if lease.client == peer.client and lease.owner is not None}
            if len(jobs_held) >= self.max_jobs_per_client:
                raise ServeError(f"{peer.who} holds {len(jobs_held)} jobs, the most one client "
                                 "may: release one first (a script's job ends with its script)")
        members = request["members"]
        hosts = _member_hosts(members)
        pool = self.inv.pool
        averaging = all(m["avg_udp_port"] for m in members)
        need = pool.job_slots + (pool.averaging_slots if averaging else 0)
        base = self._allocate(need)
        ids = self._free_ids(2 if averaging else 1)
        mode = request["mode"] or "sync"
        train = self._job_config(ids[0], members, "udp_port", base, pool.job_slots, mode,
                                 request["quorum"], request["name"] or "")
        jobs = [train]
        if averaging:
            jobs.append(self._job_config(ids[1], members, "avg_udp_port", base + pool.job_slots,
                                         pool.averaging_slots, "sync", None, "model-averaging"))
        installed: list[JobConfig] = []
        try:
            for job in jobs:
                self._install(job)
                installed.append(job)
        except ControlPlaneError:
            for job in installed:
                self._uninstall(job.job_id)
            raise
        self._cursor = base + need
        self._id_cursor = ids[-1] + 1
        policy = (request["policy"] or self.policy_name) if self.runs_policies else None
        key = secrets.token_hex(16)
        key_digest = digest(key)
        for job in jobs:
            self.leases[job.job_id] = Lease(conn, key_digest=key_digest, client=peer.client,
                                            hosts=dict(hosts))
            self.keys.put(job.job_id, key_digest, job.slots)
        if policy and policy != "none":
            self.leases[train.job_id].policy = self._policy(train.job_id, str(policy), hosts)
        grouped = any(h.ranks is not None and len(h.ranks) > 1 for h in hosts.values())
        self._event("admission", f"admitted job {train.job_id} {train.name!r}: {len(members)} "
                    f"members, slots {train.slots[0]}-{train.slots[1]}" +
                    (f", averaging job {jobs[1].job_id} slots {jobs[1].slots[0]}-"
                     f"{jobs[1].slots[1]}" if averaging else "") +
                    (f", policy {policy}" if policy else "") +
                    ("; " + "; ".join(describe(w, hosts) for w in sorted(hosts))
                     if grouped else ""), job=train.job_id,
                    name=train.name, members=len(members), slots=list(train.slots),
                    averaging_job=jobs[1].job_id if averaging else None, policy=policy,
                    hosts=[member_fields(w, hosts) for w in sorted(hosts)])
        # install_tag: the state of the switch the workers attach to (docs/protocol.md §9)
        return {"jobs": [{"job_id": j.job_id, "slot_base": j.slot_base,
                          "slot_count": j.slot_count,
                          "install_tag": wire.install_tag(self.controller.jobs[j.job_id].epoch)}
                         for j in jobs], "key": key, **self._placement(members)}

    def op_claim(self, conn: int, request: dict[str, Any]) -> dict[str, Any]:
        """After serve's restart: the jobs' owner (the key their admit gave) or the
        operator takes their leases back; nobody else."""
        ids, key, peer = request["jobs"], request["key"], self.peers[conn]
        for job_id in ids:
            lease = self.leases.get(job_id)
            if lease is None or lease.owner is not None:
                raise ServeError(f"job {job_id} is not waiting for a claim (it is "
                                 f"{'unknown' if lease is None else 'owned'})")
            if not peer.operator and not key_matches(key, lease.key_digest):
                raise ServeError(
                    f"job {job_id} is claimed with the key its admit gave, and this claim "
                    + ("presents none" if key is None else "presents another") +
                    (": only the operator may claim it (serve kept no key for it)"
                     if lease.key_digest is None else ""))
        for job_id in ids:
            lease = self.leases[job_id]
            lease.owner, lease.client = conn, peer.client
            if lease.key_digest is None and key is not None:  # the operator's claim
                lease.key_digest = digest(key)
                self.keys.put(job_id, lease.key_digest, self.controller.job(job_id).slots)
        self._event("claim", f"jobs {', '.join(map(str, ids))} claimed by connection {conn}",
                    jobs=ids, connection=conn)
        return {"jobs": ids}

    def op_release(self, conn: int, request: dict[str, Any]) -> dict[str, Any]:
        owned = [j for j, lease in self.leases.items() if lease.owner == conn]
        self._remove(owned, "released by its training script")
        return {"jobs": owned}

    def op_leave(self, conn: int, request: dict[str, Any]) -> dict[str, Any]:
        """A worker finished training: take it out of the job, so that the rounds of the
        members still finishing their last steps never wait for it. The policy's work is
        done (what is left is a drain): it stops, and the members it excluded come back."""
        job_id, worker = request["job"], request["worker"]
        lease = self._owner(conn, job_id, "leave", request["key"])
        if lease is None:
            raise ServeError(f"job {job_id} is not one of this serve's jobs")
        if worker not in {m.worker for m in self.controller.job(job_id).members}:
            raise ServeError(f"worker {worker} is not a member of job {job_id}")
        lease.left.add(worker)
        if lease.policy is not None:
            lease.policy.close()
            lease.policy = None
            self._event("policy_stopped", f"job {job_id}: worker {worker} finished; policy "
                        "stopped", job=job_id, worker=worker)
        job = self.controller.job(job_id)
        for w in sorted({m.worker for m in job.members} - job.active - lease.left):
            self.controller.readmit(job_id, w)
            self._event("readmission", f"job {job_id}: readmitted worker {w} to finish",
                        job=job_id, worker=w, by="serve", reason="a member finished")
        active = self.controller.job(job_id).active
        if worker in active and len(active) > 1:
            self.controller.exclude(job_id, worker)
        return {"job_id": job_id, "worker": worker}

    def op_mode_set(self, conn: int, request: dict[str, Any]) -> dict[str, Any]:
        job_id = request["job"]
        if request["level"]:
            raise ServeError(f"level {request['level']!r}: this serve holds one switch; levels "
                             "are those of a serve across leaves and a spine (leave it out)")
        lease = self._owner(conn, job_id, "set the mode of", request["key"])
        slots = request["slots"]  # None: the job's whole range
        mode = Mode[request["mode"].upper()]
        report = self.controller.set_mode(job_id, slots=(slots[0], slots[1]) if slots else None,
                                          mode=mode, quorum=request["quorum"])
        if lease is not None and lease.policy is not None:
            # The operator's mode stays until the operator says otherwise: a policy that
            # adopted it would still decide again after its dwell and undo it.
            lease.held = True
            lease.policy.note({"time": time.monotonic(), "action": "override", "job_id": job_id,
                               "mode": mode.name.lower(), "quorum": report.quorum,
                               "slots": list(report.slots), "held": True, "wall": time.time()})
        if report.strategy != "unchanged":
            self._event("mode_swap", f"job {job_id} slots {report.slots[0]}-{report.slots[1]}: "
                        f"operator set {mode.name.lower()} (quorum {report.quorum})" +
                        (f"; its policy holds until `hysync policy resume {job_id}`"
                         if lease and lease.policy else ""),
                        job=job_id, by="operator", mode=mode.name.lower(),
                        quorum=report.quorum, slots=list(report.slots))
        return {"job_id": job_id, "slots": list(report.slots), "mode": mode.name.lower(),
                "quorum": report.quorum, "strategy": report.strategy,
                "deleted_entries": report.deleted, "override": bool(lease and lease.policy)}

    def op_policy_resume(self, conn: int, request: dict[str, Any]) -> dict[str, Any]:
        job_id = request["job"]
        lease = self._owner(conn, job_id, "resume the policy of", request["key"])
        if lease is None or lease.policy is None:
            raise ServeError(f"job {job_id} has no policy under this serve (a job admitted "
                             "with policy none, an operator's job, or one whose members "
                             "finished)")
        if not lease.held:
            raise ServeError(f"job {job_id}'s policy is not held: it runs (an operator's "
                             "mode set holds it)")
        lease.held = False
        lease.policy.note({"time": time.monotonic(), "action": "resume", "job_id": job_id,
                           "wall": time.time()})
        lease.policy.step()  # it sees the job as the operator left it now, and adopts it
        self._event("policy_resumed", f"job {job_id}: the operator handed the job back to "
                    "its policy", job=job_id, by="operator")
        return {"job_id": job_id}

    def op_exclude(self, conn: int, request: dict[str, Any]) -> dict[str, Any]:
        self._owner(conn, request["job"], "exclude a member of", request["key"])
        r = self.controller.exclude(request["job"], request["worker"])
        return self._membership_changed("exclusion", "excluded", r)

    def op_readmit(self, conn: int, request: dict[str, Any]) -> dict[str, Any]:
        self._owner(conn, request["job"], "readmit a member of", request["key"])
        r = self.controller.readmit(request["job"], request["worker"])
        return self._membership_changed("readmission", "readmitted", r)

    def _membership_changed(self, event: str, what: str, r: MembershipReport) -> dict[str, Any]:
        """Log and answer an exclusion or readmission asked for: a member is a host, and
        the reply names it and the ranks it speaks for."""
        hosts = self.hosts_of(r.job_id)
        place = member_fields(r.worker, hosts)
        named = (f"worker {r.worker}" if r.worker not in hosts
                 else f"worker {describe(r.worker, hosts).removeprefix('member ')}")
        self._event(event, f"job {r.job_id}: {named} {what} on request", job=r.job_id,
                    worker=r.worker, by="request", members=r.members, host=place["host"],
                    ranks=place["ranks"])
        return {"job_id": r.job_id, "worker": r.worker, "members": r.members,
                "quorums": [list(q) for q in r.quorums], "host": place["host"],
                "ranks": place["ranks"]}

    def op_job_add(self, conn: int, request: dict[str, Any]) -> dict[str, Any]:
        if not self.peers[conn].operator:
            raise ServeError("job_add is the operator's (hysync --serve ADDR job add FILE); a "
                             "training script asks for a job with admit")
        job = JobConfig.from_dict(request["job"])
        report = self.controller.add_job(job, replace=bool(request["replace"]))
        self.leases.setdefault(job.job_id, Lease(OPERATOR))
        return {"job_id": job.job_id, "outcome": report.outcome, "updates": report.updates}

    def op_job_remove(self, conn: int, request: dict[str, Any]) -> dict[str, Any]:
        job_id = request["job"]
        self._owner(conn, job_id, "remove", request["key"])
        written = self._uninstall(job_id)
        self._drop_lease(job_id)
        return {"job_id": job_id, "updates": written}

    # ---------------------------------------------------------- helpers
    def _event(self, name: str, text: str, /, *, job: int | None = None,
               level: int = logging.INFO, **fields: Any) -> None:
        """Log an event (hysync/logs.py); `say`, if given, gets its text too."""
        logs.event(log, name, text, job=job, level=level, **fields)
        if self.say is not None:
            self.say(text)

    def _remove(self, job_ids: list[int], why: str) -> None:
        for job_id in job_ids:
            self._drop_lease(job_id)
            try:
                self._uninstall(job_id)
                self._event("job_removed", f"job {job_id} removed: {why}", job=job_id, why=why)
            except ControlPlaneError as err:
                self._event("job_remove_failed", f"job {job_id}: removing it failed ({err})",
                            job=job_id, level=logging.WARNING, error=str(err))

    def _drop_lease(self, job_id: int) -> None:
        self.keys.drop([job_id])
        lease = self.leases.pop(job_id, None)
        if lease is not None and lease.policy is not None:
            lease.policy.close()

    def hosts_of(self, job_id: int) -> dict[int, MemberHost]:
        """Each member's host and ranks: as its admit said, else (a job added from a job
        file, or read back after a restart) the inventory host of its MAC, ranks unknown."""
        lease = self.leases.get(job_id)
        if lease is not None and lease.hosts:
            return lease.hosts
        job = self.controller.jobs.get(job_id)
        by_mac = {h.mac.lower(): h.name for h in self.inv.hosts}
        return {} if job is None else {m.worker: MemberHost(by_mac.get(m.mac.lower()))
                                       for m in job.members}

    def members_of(self, job_id: int) -> dict[int, MemberHost]:
        """Each member of the job at serve's switch, as status and the metrics show it: on
        one switch, its host and ranks (`hosts_of`)."""
        return self.hosts_of(job_id)

    def _policy(self, job_id: int, name: str,
                hosts: dict[int, MemberHost]) -> PolicyRunner | LevelPolicies:
        path = self.policy_log
        runner = PolicyRunner(self.controller, job_id, make_policy(name, self.policy_config),
                              interval=self.policy_interval, log_path=path, hosts=hosts)
        runner.start()
        return runner

    def _allocate(self, need: int) -> int:
        """The first free range of `need` slots at or after the cursor (wrapping): slots
        after the last ones given out first, so a freed range rests before it is reused."""
        lo, hi = self.inv.pool.slots
        used = sorted({j.slots for c in self._controllers() for j in c.list_jobs()
                       if j.complete})
        starts = [self._cursor] + [b + 1 for _, b in used] + [lo]
        for start in sorted(set(starts), key=lambda s: (s < self._cursor, s)):
            end = start + need - 1
            if start >= lo and end <= hi and all(end < a or start > b for a, b in used):
                return start
        raise ServeError(f"no {need} free slots in the pool {lo}-{hi} (jobs use "
                         f"{', '.join(f'{a}-{b}' for a, b in used)}): wait for a job to end, or "
                         "lower pool.job_slots in the inventory")

    def _free_ids(self, n: int) -> list[int]:
        """`n` ids no job on the switch has, from the one after the last given (wrapping
        past 255 to 1): a finished job's id is not handed out again at once."""
        taken = {j for c in self._controllers() for j in c.jobs}
        start = self._id_cursor if 1 <= self._id_cursor < wire.MAX_JOBS else 1
        order = [*range(start, wire.MAX_JOBS), *range(1, start)]
        free = [j for j in order if j not in taken][:n]
        if len(free) < n:
            raise ServeError("every job id 1..255 is in use on the switch")
        return free


def open_primary(inv: Inventory, info: SwitchInfo, timeout: float) -> Switch:
    """A primary session with one switch of `inv` under its election id; ServeError where
    another controller holds it."""
    try:
        return Switch(info.grpc_addr, device_id=info.device_id, election_id=info.election_id,
                      timeout=timeout, tls=info.tls)
    except NotPrimaryError as err:
        if err.live is False:  # no serve holds it: the switch remembers a higher id
            raise ServeError(str(err)) from None
        raise ServeError(f"{held(inv, err, info)}: one switch has one `hysync serve`; stop "
                         "the other before starting this one") from None


def _job_table(job_id: int, rows: list[dict[str, Any]], base: int, count: int, mode: str,
               quorum: object, name: str) -> dict[str, Any]:
    """A job file's table of an admitted job (JobConfig.from_dict checks it)."""
    data: dict[str, Any] = {"job_id": job_id, "mode": mode, "name": name,
                            "slots": {"base": base, "count": count}, "members": rows}
    if quorum is not None:
        data["quorum"] = quorum
    return data


def _member_hosts(members: list[dict[str, Any]]) -> dict[int, MemberHost]:
    """Each admitted member's host and ranks; ServeError where two members claim a rank."""
    owner: dict[int, int] = {}
    for m in members:
        for rank in m["ranks"] or ():
            if rank in owner and owner[rank] != m["worker"]:
                raise ServeError(f"rank {rank} is in members {owner[rank]} and {m['worker']}: "
                                 "each of the job's ranks is on one host, sent by its member")
            owner[rank] = m["worker"]
    return {m["worker"]: MemberHost(m["host"], tuple(m["ranks"]) if m["ranks"] else None)
            for m in members}


class _TcpServer(socketserver.ThreadingTCPServer):
    allow_reuse_address = True  # a restarted serve takes its address back at once
    daemon_threads = True
    tls: ssl.SSLContext | None = None

    def get_request(self) -> tuple[socket.socket, Any]:
        sock, address = super().get_request()
        if self.tls is not None:  # the handshake runs in the connection's own thread
            sock = self.tls.wrap_socket(sock, server_side=True, do_handshake_on_connect=False)
        return sock, address


class _UnixServer(socketserver.ThreadingUnixStreamServer):
    daemon_threads = True


def _reply(err: Exception) -> dict[str, Any]:
    return {"ok": False, "error": " ".join(str(err).split()) or type(err).__name__}


def _handler(server: Server) -> type[socketserver.StreamRequestHandler]:
    class Handler(socketserver.StreamRequestHandler):
        def handle(self) -> None:
            conn = next(server._ids)
            try:
                if isinstance(self.connection, ssl.SSLSocket):
                    self.connection.settimeout(10)  # a client that never finishes it
                    self.connection.do_handshake()
                    self.connection.settimeout(None)
                peer = server.gate.peer(self.connection, self.client_address)
            except OSError as err:  # gone already, or refused by TLS (ssl.SSLError)
                log.info("connection from %s refused: %s", self.client_address, err)
                return
            with server.lock:
                server.connections.add(self.connection)
                server.peers[conn] = peer
            try:
                if peer.authenticated:  # by the socket itself: counted now
                    server._count_in(conn, peer)
                elif (evicted := server.lobby.enter(peer.client, conn, self.connection)):
                    with contextlib.suppress(OSError):  # its thread sees the end and exits
                        evicted.shutdown(socket.SHUT_RDWR)
                self.serve_lines(conn)
            except HelloRefused as err:
                self.send(_reply(err))
            except OSError:
                pass
            finally:
                server.lobby.leave(peer.client, conn)
                server._count_out(peer)
                with server.lock:
                    server.connections.discard(self.connection)
                    server.peers.pop(conn, None)
                server.connection_closed(conn)

        def serve_lines(self, conn: int) -> None:
            peer = server.peers[conn]
            while True:
                self.connection.settimeout(None if peer.authenticated
                                           else server.gate.hello_seconds)
                try:
                    line = read_line(self.rfile)  # OSError: the connection is gone
                except LineTooLong as err:
                    self.send(_reply(err))
                    if not err.skip():
                        return
                    continue
                except TimeoutError:
                    self.send(_reply(ServeError(
                        f"no hello within {server.gate.hello_seconds:g} s: "
                        f"{server.gate.refusal()}")))
                    return
                if line is None:
                    return
                try:
                    reply = server.handle(conn, parse(line))
                except HelloRefused as err:
                    if err.delay:
                        time.sleep(err.delay)
                    self.send(_reply(err))
                    return  # one hello a connection: a guess costs a connection
                except (ControlPlaneError, KeyError, ValueError, TypeError) as err:
                    reply = _reply(err)
                except Exception as err:  # a bug: the client still gets its one line
                    log.error("request of connection %d failed: %s: %s", conn,
                              type(err).__name__, err)
                    reply = {"ok": False, "error": f"internal error ({type(err).__name__}); "
                             "serve's log has it"}
                self.send(reply)

        def send(self, reply: dict[str, Any]) -> None:
            self.wfile.write((json.dumps(reply) + "\n").encode())

    return Handler
