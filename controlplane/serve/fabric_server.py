"""`hysync serve INVENTORY` where the inventory has leaves and a spine (`[[switches]]`).

The serve holds the primary session of every switch of the fabric, under each switch's
election id, for as long as it runs, and is the one writer of all of them: admissions,
leaves, exclusions and mode sets go through it (controlplane/serve/server.py describes the
requests, the leases and who may do what; they are the same here).

An admitted job spans the leaves its members' hosts sit behind (docs/protocol.md §11): the
job id and slot range come from the pool, free on every switch, and the job is installed
by controlplane/testbed/fabric.py (spine first, then the leaves, one install epoch,
rolled back on every switch when one refuses). A member's worker id is its id at its
leaf: the members behind a leaf are numbered 0.. in the order of the admit's worker ids.
The admit's reply adds `placement`: for each admitted member (by the admit's worker id),
its leaf, its worker id there, the leaf's data address, and `members`, the job's members
over every leaf (the divisor of the sum). `hysync.torch.attach` sends there. A script that
asks for background averaging (`average_every`: the members give an `avg_udp_port`) gets
its model-averaging job as on one switch, a second job over the same members, placed and
installed on every switch as the training job is (the same leaves, worker ids and
placement, its own slots free on every switch, sync at every level); it goes with the
training job (release, a closed lease, a restarted switch's re-install).

A member that finishes leaves at every level by the rule of
controlplane/testbed/member_leave.py, through the sessions the serve holds. An exclusion
or readmission names the member by the admit's worker id and is made at its leaf. A mode
set may name a level (`level`: spine, leaf or leaf:NAME), as `hysync --inventory FILE
mode set --level` does without a serve.

An admitted job gets the straggler policy its admit asks for (`policy`, else serve's
`--policy`), as on one switch, run per level (controlplane/policy/levels.py): the spine's
policy over the leaves, each leaf's over its hosts, every one reading its switch's
counters and writing its modes through the session serve holds, stepped on serve's tick.
A read that misses its deadline skips that level's tick (counted in `skipped_reads`); the
policy goes on. Its log and events name the level each decision acted on. An operator's
mode set (at any level) holds the job's policy at every level until `policy_resume`; the
policy stops when a member leaves (the hosts a leaf's policy left out come back for the
last steps, as on one switch) and when the job is removed.

A restarted switch, at either level, ends serve's session with it. Serve connects again
every policy interval until it answers, gives it the fabric deploy's pipeline and
forwarding where it came back bare (controlplane/testbed/deploy.py, on the switch's
one-switch view), and, once every switch is back, installs each held job that the
restarted switch held again on every switch the job spans, as it was (members,
exclusions, modes), under one new install epoch (docs/protocol.md §11: a switch restart
is a restart of the job). The switches that kept their part get it removed and installed
again; the workers see the new install tag and resynchronize (§9). Until then a request
that reaches the restarted switch is answered naming it, and that serve connects again.
"""

from __future__ import annotations

import dataclasses
import logging
import time
from typing import Any

from hysync.controlplane.controller import Controller
from hysync.controlplane.errors import ControlPlaneError, P4RuntimeUnreachableError
from hysync.controlplane.job import JobConfig
from hysync.controlplane.p4rt.switch import Switch
from hysync.controlplane.policy.levels import LevelPolicies, level_name
from hysync.controlplane.policy.member_hosts import MemberHost
from hysync.controlplane.serve.client import ServeError
from hysync.controlplane.serve.server import OPERATOR, Lease, Server, _job_table, open_primary
from hysync.controlplane.tables.installed import InstalledJob
from hysync.controlplane.testbed.deploy import compare_pipeline, connect, deploy_on
from hysync.controlplane.testbed.fabric import FabricController
from hysync.controlplane.testbed.inventory import Fabric, FabricSwitch, Inventory, SwitchInfo
from hysync.controlplane.testbed.job_member import JobMember
from hysync.controlplane.testbed.member_leave import exclude_member, leave_levels
from hysync.wire import Mode

log = logging.getLogger(__name__)


def leaf_placement(inv: Inventory, members: list[dict[str, Any]]) -> dict[int, tuple[str, int]]:
    """Each admitted member's leaf (its host's) and worker id there: 0.. per leaf, in the
    order of the admit's worker ids."""
    by_leaf: dict[str, list[int]] = {}
    for m in sorted(members, key=lambda m: m["worker"]):
        host = inv.host(m["host"])
        by_leaf.setdefault(host.leaf, []).append(m["worker"])
    return {worker: (leaf, i) for leaf, workers in by_leaf.items()
            for i, worker in enumerate(workers)}


class FabricServer(Server):
    """The serve of a testbed of leaves and a spine: one primary session per switch."""

    @property
    def fabric_spec(self) -> Fabric:
        assert self.inv.fabric is not None
        return self.inv.fabric

    # ---------------------------------------------------------- the switches
    def _open_switches(self) -> None:
        self.switches: dict[str, Switch] = {}
        controllers: dict[str, Controller] = {}
        # switch name -> the jobs it held before it restarted, until every switch is back
        self._lost_parts: dict[str, dict[int, InstalledJob]] = {}
        self._pushed: list[str] = []  # switches that came back bare: deploy pushed to them
        try:
            for sw in self.fabric_spec.switches:
                view = self.inv.of_switch(sw)
                switch = open_primary(self.inv, sw.switch, self.timeout)
                self.switches[sw.name] = switch
                pipeline = compare_pipeline(switch, view)
                if pipeline.state != "same":
                    raise ServeError(f"switch {sw.name}: {pipeline.detail}: run `hysync deploy "
                                     f"{self.inv.path}` first")
                controllers[sw.name] = Controller(
                    switch, keep_macs={h.mac for h in view.hosts},
                    keep_ports={h.switch_port for h in view.hosts}).attach()
        except BaseException:
            self._close_switches()
            raise
        self.fabric = FabricController(self.fabric_spec, controllers)
        spine = self.fabric_spec.spine.name
        self.switch, self.controller = self.switches[spine], controllers[spine]

    def _close_switches(self) -> None:
        for switch in self.switches.values():
            switch.close()

    def _adoptable(self) -> list[InstalledJob]:
        return [j for j in self.controller.list_jobs() if j.complete]

    def _controllers(self) -> list[Controller]:
        return list(self.fabric.controllers.values())

    def _lost(self) -> bool:
        return any(s.lost for s in self.switches.values())

    def _reconnect(self) -> bool:
        """Open a new session with every switch whose session ended, give each the fabric
        deploy's pipeline and forwarding where it came back bare, and, once every switch is
        back, install each held job that spanned a restarted switch again on all of its
        switches under one new install epoch (docs/protocol.md §11: a switch restart, at
        either level, is a restart of the job). False while a switch is not back (tried
        again at the next tick); requests meanwhile fail naming the switch."""
        gone = [sw for sw in self.fabric_spec.switches if self.switches[sw.name].lost]
        if self._lost_since is None:
            self._lost_since = time.monotonic()
            self._event("switch_lost", "the P4Runtime session with switch(es) "
                        f"{', '.join(sw.name for sw in gone)} ended (a restart, or the "
                        "connection broke); connecting again", level=logging.WARNING)
        for sw in gone:
            view = self.inv.of_switch(sw)
            try:
                switch = connect(view, timeout=self.timeout)
            except ControlPlaneError as err:
                return self._switch_not_back(err, sw)
            try:
                report = deploy_on(switch, view)
            except ControlPlaneError as err:
                switch.close()
                return self._switch_not_back(err, sw)
            with self.lock:
                self._swap(sw, switch)
                if report.push:
                    self._pushed.append(sw.name)
        with self.lock:
            restored, failed = self._restore_jobs()
            back = sorted(self._lost_parts)
            down = time.monotonic() - self._lost_since
            what = (f"no pipeline on {', '.join(self._pushed)}: pipeline and forwarding "
                    "pushed" if self._pushed else "its pipeline is the inventory's")
            jobs = (f"jobs {', '.join(map(str, restored))} installed again on every switch "
                    "they span (one new install epoch; their workers resynchronize)"
                    if restored else "no job installed again")
            if failed:
                jobs += (f"; jobs {', '.join(map(str, failed))} not installed again "
                         "(job_restore_failed above: remove them and admit them again)")
            elif not restored:
                jobs = "no job to install"
            self._event("switch_reconnected", f"switch {', '.join(back)} "
                        f"{'is' if len(back) == 1 else 'are'} back after {down:.1f} s; "
                        f"{what}; {jobs}", switches=back, jobs=restored,
                        pushed=list(self._pushed))
            self._lost_since, self._reconnect_error = None, ""
            self._lost_parts, self._pushed = {}, []
        return True

    def _swap(self, sw: FabricSwitch, switch: Switch) -> None:
        """Put the new session of `sw` where the old one was: its Controller (which the
        FabricController and the level policies hold) keeps what it last read, the jobs
        the switch held before its restart."""
        old = self.switches[sw.name]
        switch.on_write = old.on_write
        controller = self.fabric.controllers[sw.name]
        self._lost_parts[sw.name] = dict(controller.jobs)
        controller.switch = switch
        self.switches[sw.name] = switch
        if sw.role == "spine":
            self.switch = switch
        old.close()

    def _restore_jobs(self) -> tuple[list[int], list[int]]:
        """Install again each held job that a restarted switch held: the ones that went
        back, and the ones a switch refused."""
        restored: list[int] = []
        failed: list[int] = []
        for job_id in sorted(self.leases):
            lost = {name: jobs[job_id] for name, jobs in self._lost_parts.items()
                    if job_id in jobs}
            if not lost:
                continue
            try:
                report = self.fabric.restore_job(job_id, lost)
            except ControlPlaneError as err:
                self._event("job_restore_failed", f"job {job_id}: installing it again failed "
                            f"({err})", job=job_id, level=logging.WARNING, error=str(err))
                failed.append(job_id)
                continue
            restored.append(job_id)
            log.info("job %d: install epoch %d on %s", job_id, report.epoch,
                     ", ".join(name for name, _ in report.switches))
        return restored, failed

    def _switch_not_back(self, err: ControlPlaneError, sw: FabricSwitch) -> bool:
        """Log why a switch is not back yet, each new reason once (not every tick)."""
        text = f"switch {sw.name} ({sw.switch.grpc_addr}): {err}"
        if text != self._reconnect_error:
            self._reconnect_error = text
            self._event("switch_reconnect_failed", text, level=logging.WARNING, error=str(err))
        return False

    def _install(self, job: JobConfig) -> None:
        self.fabric.add_job(job)

    def _uninstall(self, job_id: int) -> int:
        return sum(updates for _, updates in self.fabric.remove_job(job_id))

    def _job_config(self, job_id: int, members: list[dict[str, Any]], port_key: str, base: int,
                    count: int, mode: str, quorum: object, name: str) -> JobConfig:
        placement = leaf_placement(self.inv, members)
        rows = []
        for m in members:
            host = self.inv.host(m["host"])
            leaf, worker = placement[m["worker"]]
            rows.append({"leaf": leaf, "worker": worker, "ipv4": host.ipv4, "mac": host.mac,
                         "udp_port": m[port_key], "switch_port": host.switch_port})
        return JobConfig.from_dict(_job_table(job_id, rows, base, count, mode, quorum, name))

    def _placement(self, members: list[dict[str, Any]]) -> dict[str, Any]:
        placement = {}
        for member, (leaf, worker) in leaf_placement(self.inv, members).items():
            info = self.fabric_spec.leaf(leaf).switch
            placement[str(member)] = {"leaf": leaf, "worker": worker, "ipv4": info.data_ipv4,
                                      "udp_port": info.data_udp_port, "behind_leaf": True}
        return {"placement": placement, "members": len(members)}

    def members_of(self, job_id: int) -> dict[int, MemberHost]:
        """The spine's members, as status and the metrics show them (they read the spine's
        job): each leaf the admitted job spans, by its uplink id (its member id at the
        spine), named by the leaf and the job's ranks behind it. None known for a job
        added from a job file."""
        lease = self.leases.get(job_id)
        if lease is None or not lease.placement:
            return {}
        behind: dict[str, list[MemberHost | None]] = {}
        for worker, (leaf, _) in sorted(lease.placement.items()):
            behind.setdefault(leaf, []).append(lease.hosts.get(worker))
        return {self.fabric_spec.leaf(leaf).uplink_id: MemberHost.of_leaf(leaf, hosts)
                for leaf, hosts in behind.items()}

    def _member_at_leaf(self, lease: Lease, job_id: int, worker: int) -> tuple[str, int]:
        if not lease.placement:
            raise ServeError(f"job {job_id} was added from a job file, not admitted: its "
                             "members are named by leaf; `hysync --inventory FILE` acts on it "
                             "once this serve is stopped")
        if worker not in lease.placement:
            raise ServeError(f"worker {worker} is not a member of job {job_id}: its members "
                             f"are {', '.join(map(str, sorted(lease.placement)))}")
        return lease.placement[worker]

    # ---------------------------------------------------------- requests
    def handle(self, conn: int, request: dict[str, Any]) -> dict[str, Any]:
        """As on one switch; a request that reached a switch whose session ended is
        answered naming the switch, and that serve is connecting again to it."""
        try:
            return super().handle(conn, request)
        except P4RuntimeUnreachableError as err:
            names = {sw.switch.grpc_addr: sw.name for sw in self.fabric_spec.switches}
            name = names.get(err.grpc_addr)
            if name is None or not self.switches[name].lost:
                raise
            raise ServeError(f"switch {name} ({err.grpc_addr}) restarted or its connection "
                             "broke: serve connects again every "
                             f"{self.policy_interval:g} s and then installs its jobs there "
                             "again; retry once serve's log says the switch is back") from None

    def op_status(self, conn: int, request: dict[str, Any]) -> dict[str, Any]:
        return dict(super().op_status(conn, request),
                    switches={sw.name: sw.switch.grpc_addr for sw in self.fabric_spec.switches})

    def op_admit(self, conn: int, request: dict[str, Any]) -> dict[str, Any]:
        """As on one switch, the model-averaging job too where the members give its
        ports: both jobs are placed alike (`_job_config`, `_placement`), and each lease
        keeps the placement, so release, teardown and a restarted switch's re-install
        treat the averaging job as the training job."""
        placement = leaf_placement(self.inv, request["members"])  # unknown hosts fail here
        reply = super().op_admit(conn, request)
        for job in reply["jobs"]:
            self.leases[job["job_id"]].placement = dict(placement)
        return reply

    def _policy(self, job_id: int, name: str, hosts: dict[int, MemberHost]) -> LevelPolicies:
        """The job's policy at every level, on serve's sessions; each member of a leaf's
        policy named by its host and ranks."""
        placement = leaf_placement(self.inv, [{"worker": w, "host": h.host}
                                              for w, h in hosts.items()])
        by_level: dict[str, dict[int, MemberHost]] = {}
        for worker, (leaf, leaf_worker) in placement.items():
            by_level.setdefault(f"leaf:{leaf}", {})[leaf_worker] = hosts[worker]
        levels = [(level_name(sw.role, sw.name), self.fabric.controller(sw))
                  for sw in self.fabric_spec.switches]
        policies = LevelPolicies(levels, job_id, policy=name, interval=self.policy_interval,
                                 log_path=self.policy_log, config=self.policy_config,
                                 hosts=by_level)
        # Each level's first step is its first reading; one that misses its deadline is
        # counted and taken again on the next tick.
        policies.step()
        return policies

    def op_leave(self, conn: int, request: dict[str, Any]) -> dict[str, Any]:
        """A member finished: excluded at its leaf, and its leaf at the spine when it was
        the leaf's last active host (member_leave.py's rule, through serve's sessions)."""
        job_id, worker = request["job"], request["worker"]
        lease = self._owner(conn, job_id, "leave", request["key"])
        if lease is None:
            raise ServeError(f"job {job_id} is not one of this serve's jobs")
        leaf, leaf_worker = self._member_at_leaf(lease, job_id, worker)
        installed = self.fabric.controllers[leaf].job(job_id)
        member = next(m for m in installed.members if m.worker == leaf_worker)
        me = JobMember(member, leaf, self.fabric_spec.leaf(leaf).switch, len(lease.placement))
        by_addr = {sw.switch.grpc_addr: self.fabric.controller(sw)
                   for sw in self.fabric_spec.switches}

        def exclude_at(info: SwitchInfo, w: int) -> int | None:
            return exclude_member(by_addr[info.grpc_addr], job_id, w)
        lease.left.add(worker)
        if lease.policy is not None:
            self._stop_policy(job_id, lease, worker)
        report = leave_levels(self.inv, me, exclude_at)
        self._event("leave", report.text(job_id), job=job_id, worker=worker, leaf=leaf,
                    excluded_at=report.excluded_at)
        return {"job_id": job_id, "worker": worker, "excluded_at": report.excluded_at}

    def _stop_policy(self, job_id: int, lease: Lease, worker: int) -> None:
        """A member finished: the policy stops at every level, and the hosts a leaf's
        policy (or the operator) left out come back for the last steps, so that a leaf's
        last active host is the last one training there (member_leave.py's rule)."""
        assert lease.policy is not None
        lease.policy.close()
        lease.policy, lease.held = None, False
        self._event("policy_stopped", f"job {job_id}: worker {worker} finished; policy "
                    "stopped at every level", job=job_id, worker=worker)
        out: dict[str, set[int]] = {}
        for member, (leaf, leaf_worker) in lease.placement.items():
            if member not in lease.left:
                out.setdefault(leaf, set()).add(leaf_worker)
        for leaf, training in sorted(out.items()):
            controller = self.fabric.controllers[leaf]
            for w in sorted(training - controller.job(job_id).active):
                controller.readmit(job_id, w)
                self._event("readmission", f"job {job_id}: readmitted worker {w} at {leaf} to "
                            "finish", job=job_id, worker=w, leaf=leaf, by="serve",
                            reason="a member finished")

    def op_mode_set(self, conn: int, request: dict[str, Any]) -> dict[str, Any]:
        job_id = request["job"]
        lease = self._owner(conn, job_id, "set the mode of", request["key"])
        slots = request["slots"]
        mode = Mode[request["mode"].upper()]
        reports = self.fabric.set_mode(job_id, level=request["level"],
                                       slots=(slots[0], slots[1]) if slots else None,
                                       mode=mode, quorum=request["quorum"])
        switches = [{"name": name, "slots": list(r.slots), "quorum": r.quorum,
                     "strategy": r.strategy, "deleted_entries": r.deleted}
                    for name, r in reports]
        level = request["level"] or "every level"
        override = lease is not None and lease.policy is not None
        if override:
            # As on one switch: the operator's mode stays until the operator hands the job
            # back (policy_resume). Every level waits, so that one resume of the job hands
            # all of it back, whichever level the operator set.
            assert lease is not None and lease.policy is not None
            lease.held = True
            lease.policy.note({"time": time.monotonic(), "action": "override",
                               "job_id": job_id, "mode": mode.name.lower(),
                               "at": level, "switches": [s["name"] for s in switches],
                               "held": True, "wall": time.time()})
        self._event("mode_swap", f"job {job_id} at {level}: operator set "
                    f"{mode.name.lower()} on " + ", ".join(s["name"] for s in switches) +
                    (f"; its policy holds until `hysync policy resume {job_id}`"
                     if override else ""),
                    job=job_id, by="operator", mode=mode.name.lower(), at=level,
                    switches=switches)
        first = reports[0][1]
        return {"job_id": job_id, "slots": list(first.slots), "mode": mode.name.lower(),
                "quorum": first.quorum, "level": request["level"],
                "strategy": ", ".join(f"{s['name']} {s['strategy']}" for s in switches),
                "deleted_entries": sum(s["deleted_entries"] for s in switches),
                "override": override, "switches": switches}

    def _at_leaf(self, conn: int, request: dict[str, Any], what: str, event: str) -> dict[str, Any]:
        job_id, worker = request["job"], request["worker"]
        lease = self._owner(conn, job_id, f"{what} a member of", request["key"])
        if lease is None:
            raise ServeError(f"job {job_id} is not one of this serve's jobs")
        leaf, leaf_worker = self._member_at_leaf(lease, job_id, worker)
        controller = self.fabric.controllers[leaf]
        change = controller.exclude if what == "exclude" else controller.readmit
        report = dataclasses.replace(change(job_id, leaf_worker), worker=worker)
        reply = self._membership_changed(event, f"{what}d at {leaf}", report)
        return dict(reply, leaf=leaf, leaf_worker=leaf_worker)

    def op_exclude(self, conn: int, request: dict[str, Any]) -> dict[str, Any]:
        return self._at_leaf(conn, request, "exclude", "exclusion")

    def op_readmit(self, conn: int, request: dict[str, Any]) -> dict[str, Any]:
        return self._at_leaf(conn, request, "readmit", "readmission")

    def op_job_add(self, conn: int, request: dict[str, Any]) -> dict[str, Any]:
        if not self.peers[conn].operator:
            raise ServeError("job_add is the operator's (hysync --serve ADDR job add FILE); a "
                             "training script asks for a job with admit")
        job = JobConfig.from_dict(request["job"])
        report = self.fabric.add_job(job, replace=bool(request["replace"]))
        self.leases.setdefault(job.job_id, Lease(OPERATOR))
        outcomes = sorted({r.outcome for _, r in report.switches})
        return {"job_id": job.job_id, "outcome": "/".join(outcomes) + f" on "
                f"{len(report.switches)} switches", "updates": report.updates,
                "switches": [{"name": n, "outcome": r.outcome, "updates": r.updates}
                             for n, r in report.switches]}
