"""What a testbed needs on its switch before any job: `hysync deploy`, `--check`, `teardown`.

Deploy owns the pipeline, one l2 entry per host (its MAC -> its switch port) and the
flood group's host ports; jobs (controlplane/serve/server.py) add the rest. Every function
reads the switch first and writes only the difference, so a second deploy writes
nothing. A pipeline push clears every entry of the switch, so deploy pushes only
when the switch has none; a switch running another pipeline is refused unless
`replace_pipeline`. Identity of a pipeline: the cookie `Switch.push_pipeline` gives it
(a hash of P4Info and device config), or the P4Info itself when the cookie is 0 (a
switch that started with its P4Info preloaded).
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass, field

from hysync import p4names
from hysync.controlplane.controller import Controller
from hysync.controlplane.errors import ControlPlaneError, NotPrimaryError
from hysync.controlplane.p4rt.device_config import read_device_config
from hysync.controlplane.p4rt.entities import MulticastGroup, Update, delete, insert, modify
from hysync.controlplane.p4rt.switch import Switch, pipeline_cookie
from hysync.controlplane.tables import forwarding
from hysync.controlplane.tables.installed import InstalledJob
from hysync.controlplane.testbed import probe
from hysync.controlplane.testbed.inventory import Host, Inventory, SwitchInfo
from hysync.p4schema import Schema


class DeployError(ControlPlaneError):
    """The switch is not in a state deploy may change (another pipeline, another owner)."""


@dataclass(frozen=True, slots=True)
class Pipeline:
    """How the switch's pipeline compares with the inventory's."""

    state: str  # same | none | other
    detail: str


@dataclass(slots=True)
class DeployReport:
    push: bool  # the pipeline was (or, dry run, would be) pushed
    updates: list[Update] = field(default_factory=list)
    pipeline: Pipeline | None = None


@dataclass(frozen=True, slots=True)
class Check:
    name: str
    ok: bool
    detail: str
    skipped: bool = False  # not run (no way to run it from here): neither ok nor failed

    def line(self) -> str:
        state = "skip" if self.skipped else "ok  " if self.ok else "FAIL"
        return f"{state}  {self.name}: {self.detail}"


def connect(inv: Inventory, *, read_only: bool = False, timeout: float = 5.0) -> Switch:
    """A session with the inventory's switch under the inventory's election id."""
    s = inv.switch
    try:
        return Switch(s.grpc_addr, device_id=s.device_id, election_id=s.election_id,
                      timeout=timeout, arbitrate=not read_only, tls=s.tls)
    except NotPrimaryError as err:
        raise DeployError(f"{held(inv, err)}: is `hysync serve {inv.path}` running? stop it "
                          "first") from None


def held(inv: Inventory, err: NotPrimaryError, info: SwitchInfo | None = None) -> str:
    """Who holds the switch (`info`, by default the inventory's), from a refused
    arbitration."""
    info = info or inv.switch
    high, low = err.primary or info.election_id
    who = f"{low}" if high == 0 else f"{high},{low}"
    return f"a controller with election id {who} holds the switch at {info.grpc_addr}"


def inventory_schema(inv: Inventory) -> tuple[Schema, int]:
    """The inventory's P4Info and the cookie a push of it (with its device config) gets."""
    schema = Schema.from_file(inv.switch.p4info)
    config = read_device_config(inv.switch.device_config, "bmv2") if inv.switch.device_config \
        else b""  # bounded read; what push_pipeline sends (target bmv2: the file as it is)
    return schema, pipeline_cookie(schema, config)


def compare_pipeline(switch: Switch, inv: Inventory) -> Pipeline:
    mine, cookie = inventory_schema(inv)
    theirs, their_cookie = switch.fetch_pipeline()
    if theirs is None:
        return Pipeline("none", f"the switch has no pipeline; the inventory's has cookie "
                                f"{cookie:#018x}")
    if their_cookie == cookie:
        return Pipeline("same", f"cookie {cookie:#018x} ({inv.switch.p4info.name})")
    same_p4info = theirs.p4info.SerializeToString() == mine.p4info.SerializeToString()
    if their_cookie == 0 and same_p4info:
        return Pipeline("same", f"the inventory's P4Info ({inv.switch.p4info.name}; the switch "
                                "was started with it, no cookie)")
    what = "the same P4Info with another device config" if same_p4info else "another P4Info"
    return Pipeline("other", f"the switch runs cookie {their_cookie:#018x} ({what}), the "
                             f"inventory's is {cookie:#018x}")


def forwarding_updates(inv: Inventory, l2: dict[str, int],
                       flood: MulticastGroup | None) -> list[Update]:
    """The writes that make every host reachable: l2 entries and flood ports."""
    updates: list[Update] = []
    for h in inv.hosts:
        have = l2.get(h.mac)
        if have is None:
            updates.append(insert(forwarding.l2_entry(h.mac, h.switch_port)))
        elif have != h.switch_port:
            updates.append(modify(forwarding.l2_entry(h.mac, h.switch_port)))
    ports = {h.switch_port for h in inv.hosts}
    if not ports:  # a spine: its ports are its leaves', which the jobs program
        return updates
    if flood is None:
        updates.append(insert(forwarding.flood_group(ports)))
    elif not ports <= flood.ports():
        updates.append(modify(forwarding.flood_group(flood.ports() | ports)))
    return updates


def _forwarding_state(switch: Switch) -> tuple[dict[str, int], MulticastGroup | None]:
    l2 = dict(map(forwarding.l2_of,
                  switch.read_tables([p4names.FORWARDING_L2])[p4names.FORWARDING_L2]))
    flood = next((g for g in switch.read_groups() if g.group_id == forwarding.FLOOD_GROUP), None)
    return l2, flood


def deploy(inv: Inventory, *, dry_run: bool = False, replace_pipeline: bool = False,
           timeout: float = 5.0) -> DeployReport:
    """Push the pipeline if the switch has none, and the hosts' forwarding it lacks."""
    with connect(inv, read_only=dry_run, timeout=timeout) as switch:
        return deploy_on(switch, inv, dry_run=dry_run, replace_pipeline=replace_pipeline)


def deploy_on(switch: Switch, inv: Inventory, *, dry_run: bool = False,
              replace_pipeline: bool = False) -> DeployReport:
    """`deploy` through a session already open (the primary's, unless `dry_run`)."""
    pipeline = compare_pipeline(switch, inv)
    if pipeline.state == "other" and not replace_pipeline:
        raise DeployError(f"{pipeline.detail}: deploy would clear every entry of it; pass "
                          "--replace-pipeline if that is what you want, or fix "
                          "switch.p4info / switch.device_config in the inventory")
    push = pipeline.state != "same"
    l2, flood = ({}, None) if push else _forwarding_state(switch)
    report = DeployReport(push, forwarding_updates(inv, l2, flood), pipeline)
    if dry_run:
        return report
    if push:
        switch.push_pipeline(inv.switch.p4info, inv.switch.device_config)
    switch.write(report.updates)
    return report


def check(inv: Inventory, *, timeout: float = 5.0, source: Host | None = None,
          no_source: str = "", probe_wait: float | None = None) -> list[Check]:
    """Reachability, arbitration, pipeline identity and the port map; a failed check
    stops the ones that depend on it. The port map is the l2 table and flood group read
    back, and, from `source` (this machine's host; `no_source` says why there is none),
    a probe through the data plane that waits up to `probe_wait` (default `timeout`, the
    deadline of each request to the switch) for answers."""
    s = inv.switch
    try:
        switch = Switch(s.grpc_addr, device_id=s.device_id, timeout=timeout, arbitrate=False,
                        connect_timeout=timeout, tls=s.tls)
    except ControlPlaneError as err:
        return [Check("reachable", False, str(err))]
    with switch:
        checks = [Check("reachable", True, f"P4Runtime at {s.grpc_addr}, device {s.device_id}"),
                  _check_arbitration(inv, timeout)]
        pipeline = compare_pipeline(switch, inv)
        checks.append(Check("pipeline", pipeline.state == "same", pipeline.detail))
        if pipeline.state != "same":
            return checks
        l2, flood = _forwarding_state(switch)
    result, probe_check = _probe(inv, source, no_source,
                                 timeout if probe_wait is None else probe_wait)
    checks.append(probe_check)
    flood_ports = flood.ports() if flood else set()
    return checks + [_port_map(h, l2, flood_ports, result) for h in inv.hosts]


def _port_map(h: Host, l2: dict[str, int], flood_ports: set[int],
              result: probe.Probe | None) -> Check:
    """A host's line: its l2 entry and flood port read back, and what the probe says."""
    problems = []
    if l2.get(h.mac) != h.switch_port:
        problems.append(f"l2 sends {h.mac} to port {l2[h.mac]}" if h.mac in l2
                        else f"no l2 entry for {h.mac}")
    if h.switch_port not in flood_ports:
        problems.append(f"port {h.switch_port} is not in the flood group")
    detail = ("; ".join(problems) + "; run `hysync deploy` to fix" if problems else
              f"{h.mac} -> port {h.switch_port}, flooded")
    probed_ok = True
    if result is not None and h.name in result.answers:
        probed_ok, said = probe.verdict(h, result.answers[h.name], result,
                                        flooded=h.mac not in l2)
        detail += f"; {said}"
    elif result is not None:
        detail += "; the probe's source"
    return Check(f"port map {h.name}", probed_ok and not problems, detail)


def _probe(inv: Inventory, source: Host | None, no_source: str,
           timeout: float) -> tuple[probe.Probe | None, Check]:
    """The probe from `source` to every other host, and its line."""
    if source is None:
        return None, Check("probe", False, f"not sent: {no_source}; to ping every host "
                                           "through the switch, run `hysync deploy --check "
                                           f"--from HOST {inv.path}` on a host of the "
                                           "inventory, as root", skipped=True)
    try:
        result = probe.probe(source, [h for h in inv.hosts if h != source], timeout)
    except probe.ProbeError as err:
        return None, Check("probe", False, f"cannot probe from {source.name}: {err}")
    return result, Check("probe", *probe.source_verdict(result))


def _check_arbitration(inv: Inventory, timeout: float) -> Check:
    s = inv.switch
    high, low = s.election_id
    election = f"{low}" if high == 0 else f"{high},{low}"
    try:
        with Switch(s.grpc_addr, device_id=s.device_id, election_id=s.election_id,
                    timeout=timeout, connect_timeout=timeout, tls=s.tls):
            return Check("arbitration", True, f"election id {election} becomes primary (no "
                                              "controller holds the switch now)")
    except NotPrimaryError as err:
        if err.primary is None or err.primary == s.election_id:
            return Check("arbitration", True, f"election id {election} is in use: `hysync "
                                              "serve` holds the switch")
        return Check("arbitration", False, f"{err}; raise switch.election_id in the inventory")
    except ControlPlaneError as err:
        return Check("arbitration", False, str(err))


def inventory_jobs(controller: Controller, inv: Inventory) -> list[InstalledJob]:
    """The installed jobs whose members are all hosts of the inventory."""
    macs = {h.mac for h in inv.hosts}
    return [j for j in controller.list_jobs()
            if j.members and all(m.mac in macs for m in j.members)]


def teardown(inv: Inventory, *, dry_run: bool = False, timeout: float = 5.0,
             say: Callable[[str], None] = lambda _: None) -> int:
    """Remove the inventory's jobs, then the hosts' l2 entries and flood ports; entries
    of anything else stay. Returns the number of updates (dry run: that would be made)."""
    written = 0
    with connect(inv, read_only=dry_run, timeout=timeout) as switch:
        if not switch.has_pipeline:
            say("the switch has no pipeline: nothing to remove")
            return 0
        controller = Controller(switch)
        for job in inventory_jobs(controller, inv):
            if dry_run:
                say(f"would remove job {job.job_id} (slots {job.slots[0]}-{job.slots[1]})")
                continue
            n = controller.remove_job(job.job_id)
            say(f"job {job.job_id} removed ({n} updates)")
            written += n
        l2, flood = _forwarding_state(switch)
        updates = [delete(forwarding.l2_entry(h.mac, l2[h.mac])) for h in inv.hosts
                   if h.mac in l2]
        if flood is not None:
            keep = flood.ports() - {h.switch_port for h in inv.hosts}
            if keep != flood.ports():
                updates.append(modify(forwarding.flood_group(keep)) if keep else delete(flood))
        for u in updates:
            say(("would write " if dry_run else "") + str(u))
        if not dry_run:
            switch.write(updates)
        written += len(updates)
    return written
