"""A testbed as data: one TOML inventory file per rack, validated on load.

    name = "rack-1"

    [switch]
    grpc_addr = "10.1.0.10:9559"    # its P4Runtime server
    device_id = 1
    election_id = 10                # `hysync serve`'s; the one primary of the switch
    target = "softswitch"           # softswitch | bmv2 | tofino
    p4info = "hysync:p4src/v1model/hysync.p4info.txtpb"  # shipped; or a path relative to this file
    device_config = "../build/p4/hysync.json"         # bmv2 / tofino only
    data_ipv4 = "10.0.0.254"        # where workers send HySync packets
    data_mac = "02:00:00:00:00:fe"
    data_udp_port = 48620           # the softswitch's UDP data plane may use another
    cacert = "/etc/hysync/ca.pem"   # P4Runtime over TLS (hysync/tls.py): the switch's CA,
    cert = "/etc/hysync/ctl.pem"    # and for mutual TLS the controller's certificate
    private_key = "/etc/hysync/ctl.key"  # and key

    [pool]                          # the switch's slots that jobs are given from
    slot_base = 0
    slot_count = 8192
    job_slots = 256                 # a training job's window
    averaging_slots = 64            # its model-averaging job

    [serve]
    listen = "10.1.0.10:9600"       # or "unix:/run/hysync/serve.sock"
    token_file = "/etc/hysync/serve.token"   # required off loopback (controlplane/serve/auth.py)

    [[hosts]]                       # one table per server
    name = "h1"
    interface = "eth1"              # its data interface
    ipv4 = "10.0.0.1"
    mac = "02:00:00:00:01:01"
    switch_port = 1

A testbed of several switches, a job aggregated at each top-of-rack switch (leaf) and again
at a spine (docs/protocol.md §11), replaces `[switch]` with one `[[switches]]` table per
switch, each with every key of `[switch]` and its `name` and `role`; each host names the
leaf it sits behind:

    [[switches]]
    name = "spine"
    role = "spine"
    grpc_addr = "10.1.0.1:9559"     # ... and the other keys of [switch]
    data_ipv4 = "10.0.0.250"
    data_mac = "02:00:00:00:00:fa"

    [[switches]]
    name = "leaf-a"
    role = "leaf"
    uplink_port = 9                 # the leaf's port toward the spine
    spine_port = 1                  # the spine's port toward this leaf
    grpc_addr = "10.1.0.10:9559"    # ...
    data_ipv4 = "10.0.1.254"        # the spine admits the leaf's sums from this address
    data_mac = "02:00:00:00:01:fe"

    [[hosts]]
    name = "h1"
    leaf = "leaf-a"                 # switch_port is then a port of leaf-a
    ...

One spine, 1..32 leaves (a leaf is a member of the spine's job: its position among the
leaves is its member id there), at most 32 hosts behind a leaf and 255 in all (a RESULT's
count byte). Every switch gets its slots from the one `[pool]`: a job has the same slot
range on every switch it spans.

Every error is an `InventoryError` naming the file, the field and what would be valid.
"""

from __future__ import annotations

import dataclasses
import ipaddress
from collections.abc import Mapping
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from hysync import resources, wire
from hysync.controlplane.errors import ControlPlaneError
from hysync.controlplane.job import MAX_SWITCH_PORT
from hysync.controlplane.p4rt.switch import ElectionId, parse_election_id
from hysync.controlplane.testbed.serve_access import (
    ServeAccess,
    access_from_table,
    loopback,
    parse_listen,
)
from hysync.controlplane.toml_fields import int_field, load_toml, no_unknown_keys, tables
from hysync.errors import BadFileError
from hysync.tls import ClientTls

TARGETS = ("softswitch", "bmv2", "tofino")
ROLES = ("leaf", "spine")
DEFAULT_SERVE = "127.0.0.1:9600"
MAX_LEAVES = wire.MAX_WORKERS  # a leaf is a member of the spine's job
MAX_FABRIC_HOSTS = 255  # a RESULT's count byte carries the hosts in a sum
_TOP_KEYS = {"name", "switch", "switches", "pool", "serve", "hosts"}
_SWITCH_KEYS = {"grpc_addr", "device_id", "election_id", "target", "p4info", "device_config",
                "data_ipv4", "data_mac", "data_udp_port", "cacert", "cert", "private_key",
                "insecure"}
_POOL_KEYS = {"slot_base", "slot_count", "job_slots", "averaging_slots"}
_SERVE_KEYS = {"listen", "token_file", "operator_token_file", "socket_mode", "cacert", "cert",
               "private_key", "client_cert", "client_key", "operators"}
_FABRIC_SWITCH_KEYS = _SWITCH_KEYS | {"name", "role", "uplink_port", "spine_port"}
_HOST_KEYS = {"name", "interface", "ipv4", "mac", "switch_port"}
_FABRIC_HOST_KEYS = _HOST_KEYS | {"leaf"}


class InventoryError(ControlPlaneError, BadFileError):
    """An inventory that does not describe a usable testbed; the message names the field."""


@dataclass(frozen=True, slots=True)
class SwitchInfo:
    grpc_addr: str
    device_id: int
    election_id: ElectionId
    target: str
    p4info: Path
    device_config: Path | None
    data_ipv4: str
    data_mac: str
    data_udp_port: int
    tls: ClientTls | None = None  # P4Runtime in the clear without
    insecure: bool = False  # in the clear off loopback, on purpose (`insecure = true`)

    def exposed(self) -> str | None:
        """Why deploy and serve should not run against this switch unless told to: it
        speaks P4Runtime in the clear on an address other machines may reach, where any
        of them can arbitrate and write past serve. None where that is not so."""
        if self.tls is not None or loopback(self.grpc_addr.rpartition(":")[0]) or self.insecure:
            return None
        return (f"the switch at {self.grpc_addr} speaks P4Runtime in the clear: any machine "
                "that reaches it can take the primary role and write past serve. Give [switch] "
                "cacert, cert and private_key (mutual TLS; the softswitch's --writer then takes "
                "writes from serve's certificate only), or accept it with --insecure (or "
                "insecure = true in [switch])")


@dataclass(frozen=True, slots=True)
class Pool:
    slot_base: int
    slot_count: int
    job_slots: int
    averaging_slots: int

    @property
    def slots(self) -> tuple[int, int]:
        return self.slot_base, self.slot_base + self.slot_count - 1


@dataclass(frozen=True, slots=True)
class Host:
    name: str
    interface: str
    ipv4: str
    mac: str
    switch_port: int
    leaf: str = ""  # the leaf switch it sits behind; "" on a one-switch testbed


@dataclass(frozen=True, slots=True)
class FabricSwitch:
    """One switch of a testbed of leaves and a spine."""

    name: str
    role: str  # leaf | spine
    switch: SwitchInfo
    uplink_id: int = -1  # a leaf: its member id at the spine (its position among the leaves)
    uplink_port: int = -1  # a leaf: its port toward the spine
    spine_port: int = -1  # a leaf: the spine's port toward it


@dataclass(frozen=True, slots=True)
class Fabric:
    """The switches of a two-level testbed and which hosts sit behind which leaf."""

    spine: FabricSwitch
    leaves: tuple[FabricSwitch, ...]

    @property
    def switches(self) -> tuple[FabricSwitch, ...]:
        return (self.spine, *self.leaves)

    def leaf(self, name: str) -> FabricSwitch:
        for leaf in self.leaves:
            if leaf.name == name:
                return leaf
        raise InventoryError(f"no leaf {name!r}: the leaves are "
                             f"{', '.join(lf.name for lf in self.leaves)}")


@dataclass(frozen=True, slots=True)
class Inventory:
    path: Path
    name: str
    switch: SwitchInfo
    pool: Pool
    serve: str  # HOST:PORT or unix:PATH
    hosts: tuple[Host, ...]
    access: ServeAccess = ServeAccess()  # who may talk to serve
    fabric: Fabric | None = None  # leaves and a spine; `switch` is then the spine's

    def hosts_behind(self, leaf: str) -> tuple[Host, ...]:
        return tuple(h for h in self.hosts if h.leaf == leaf)

    def of_switch(self, sw: FabricSwitch) -> Inventory:
        """One switch of the fabric as a one-switch testbed: its pipeline and the hosts on
        its ports (a leaf's hosts; the spine has none, its ports are the leaves')."""
        hosts = self.hosts_behind(sw.name) if sw.role == "leaf" else ()
        return dataclasses.replace(self, switch=sw.switch, hosts=hosts, fabric=None)

    def host(self, name: str) -> Host:
        for h in self.hosts:
            if h.name == name:
                return h
        raise InventoryError(f"{self.path}: no host {name!r}; the hosts are "
                             f"{', '.join(h.name for h in self.hosts)}")

    @classmethod
    def load(cls, path: str | Path) -> Inventory:
        path = Path(path)
        return load_toml(path, lambda data: cls.from_dict(data, base=path.resolve().parent,
                                                          path=path),
                         InventoryError, "the inventory", "the one docs/testbed.md shows")

    @classmethod
    def from_dict(cls, data: Mapping[str, Any], *, base: Path,
                  path: Path = Path("<inventory>")) -> Inventory:
        """Validate `data`; relative paths are taken from `base` (the file's directory)."""
        no_unknown_keys(data, _TOP_KEYS, "the inventory")
        name = data.get("name", "")
        if not isinstance(name, str):
            raise InventoryError(f"name = {name!r}: give a string, e.g. name = \"rack-1\"")
        fabric = None
        if "switches" in data:
            if "switch" in data:
                raise InventoryError("[switch] and [[switches]] together: describe one switch "
                                     "with [switch], or leaves and a spine with one "
                                     "[[switches]] table each (see docs/testbed.md)")
            fabric = _fabric(data["switches"], base)
            switch = fabric.spine.switch
        else:
            switch = _switch(_table(data, "switch", required=True), base)
        pool = _pool(_table(data, "pool"))
        serve = _table(data, "serve")
        no_unknown_keys(serve, _SERVE_KEYS, "[serve]")
        listen = serve.get("listen", DEFAULT_SERVE)
        try:
            parse_listen(listen)
        except ValueError as err:
            raise InventoryError(f"serve.listen: {err}") from None
        try:
            access = access_from_table(dict(serve), base)
        except ValueError as err:
            raise InventoryError(str(err)) from None
        hosts = _hosts(data.get("hosts"), fabric)
        for sw in fabric.switches if fabric else ():
            _check_data_address(hosts, sw.switch, f"switch {sw.name!r}")
        if fabric is None:
            _check_data_address(hosts, switch, "the switch")
        return cls(path, name, switch, pool, listen, hosts, access, fabric)


def _check_data_address(hosts: tuple[Host, ...], switch: SwitchInfo, which: str) -> None:
    for h in hosts:
        if h.mac == switch.data_mac or (h.ipv4 == switch.data_ipv4 and not _loopback(h.ipv4)):
            raise InventoryError(f"hosts[{h.name}] has {which}'s data address "
                                 f"({switch.data_ipv4} / {switch.data_mac}): give the "
                                 "switch and every host their own")


# ------------------------------------------------------------------ sections
def _fabric(raw: Any, base: Path) -> Fabric:
    if not isinstance(raw, list) or not raw:
        raise InventoryError("switches is empty or not a list of tables: add one [[switches]] "
                             "table per switch, one with role = \"spine\" and the leaves with "
                             "role = \"leaf\"")
    spines: list[FabricSwitch] = []
    leaves: list[FabricSwitch] = []
    seen: dict[tuple[str, object], str] = {}
    for where, item in tables(raw, "switches", _FABRIC_SWITCH_KEYS, InventoryError):
        name = _string(item, f"{where}.name", "name", 'e.g. name = "leaf-a"')
        role = item.get("role")
        if role not in ROLES:
            raise InventoryError(f"{where}.role = {role!r}: choose leaf or spine (a testbed of "
                                 "one switch uses [switch] instead of [[switches]])")
        switch_table = {k: v for k, v in item.items()
                        if k not in ("name", "role", "uplink_port", "spine_port")}
        try:
            info = _switch(switch_table, base)
        except InventoryError as err:
            raise InventoryError(str(err).replace("switch.", f"switches[{name}].")) from None
        for field, value in (("name", name), ("grpc_addr", (info.grpc_addr, info.device_id)),
                             ("data_ipv4", info.data_ipv4), ("data_mac", info.data_mac)):
            other = seen.get((field, value))
            if other is not None:
                raise InventoryError(f"switches {other!r} and {name!r} have the same {field} "
                                     f"{value!r}: every switch needs its own")
            seen[(field, value)] = name
        if role == "spine":
            for key in ("uplink_port", "spine_port"):
                if key in item:
                    raise InventoryError(f"switches[{name}].{key}: only a leaf has one; the "
                                         "spine's ports are its leaves' spine_port")
            spines.append(FabricSwitch(name, role, info))
            continue
        ports = {key: int_field(item, key, 0, MAX_SWITCH_PORT, f"0..{MAX_SWITCH_PORT}",
                                field=f"switches[{name}].{key}")
                 for key in ("uplink_port", "spine_port")}
        leaves.append(FabricSwitch(name, role, info, len(leaves), ports["uplink_port"],
                                   ports["spine_port"]))
    if not spines:
        raise InventoryError("no switch has role = \"spine\": a job across leaves is summed "
                             "again at one spine; add its [[switches]] table")
    if len(spines) > 1:
        raise InventoryError(f"two spines ({spines[0].name!r} and {spines[1].name!r}): a "
                             "testbed has one spine; make the others leaves or leave them out")
    if not leaves:
        raise InventoryError(f"spine {spines[0].name!r} has no leaves: add [[switches]] with "
                             "role = \"leaf\" (or describe one switch with [switch])")
    if len(leaves) > MAX_LEAVES:
        raise InventoryError(f"{len(leaves)} leaves: a spine admits at most {MAX_LEAVES} (each "
                             "leaf is one of its job's members); split the testbed")
    taken: dict[int, str] = {}
    for leaf in leaves:
        if leaf.spine_port in taken:
            raise InventoryError(f"leaves {taken[leaf.spine_port]!r} and {leaf.name!r} both "
                                 f"have spine_port = {leaf.spine_port}: each leaf is cabled to "
                                 "its own port of the spine")
        taken[leaf.spine_port] = leaf.name
    return Fabric(spines[0], tuple(leaves))


def _table(data: Mapping[str, Any], key: str, *, required: bool = False) -> Mapping[str, Any]:
    value = data.get(key)
    if value is None and not required:
        return {}
    if not isinstance(value, Mapping):
        raise InventoryError(f"[{key}] is missing or not a table: add a `[{key}]` section "
                             "(see docs/testbed.md)")
    return value


def _switch(t: Mapping[str, Any], base: Path) -> SwitchInfo:
    no_unknown_keys(t, _SWITCH_KEYS, "[switch]")
    grpc_addr = _string(t, "switch.grpc_addr", "grpc_addr", 'e.g. grpc_addr = "10.1.0.10:9559"')
    host, sep, port = grpc_addr.rpartition(":")
    if not (sep and host and port.isdigit() and 0 < int(port) < 65536):
        raise InventoryError(f"switch.grpc_addr = {grpc_addr!r} is not HOST:PORT: write it "
                             'as e.g. "10.1.0.10:9559"')
    device_id = int_field(t, "device_id", 1, (1 << 64) - 1, "a device id >= 1", default=1,
                     field="switch.device_id")
    raw_election = t.get("election_id", 10)
    try:
        if isinstance(raw_election, bool) or not isinstance(raw_election, int | str):
            raise ValueError(f"election id {raw_election!r} must be a number or 'high,low'")
        election = parse_election_id(str(raw_election))
        if election == (0, 0):
            raise ValueError("election id 0 cannot be primary: use 1 or more")
    except ValueError as err:
        raise InventoryError(f"switch.election_id: {err}") from None
    target = t.get("target")
    if target not in TARGETS:
        raise InventoryError(f"switch.target = {target!r}: choose one of {', '.join(TARGETS)}")
    p4info = _file(t, "p4info", base, required=True)
    assert p4info is not None
    device_config = _file(t, "device_config", base, required=target != "softswitch")
    data_ipv4 = _ipv4(t, "data_ipv4", "switch", default="10.0.0.254")
    data_mac = _mac(t, "data_mac", "switch", default="02:00:00:00:00:fe")
    udp = int_field(t, "data_udp_port", 1, 65535, "1..65535", default=wire.HYSYNC_UDP_PORT,
               field="switch.data_udp_port")
    tls_files = {key: _file(t, key, base, required=False)
                 for key in ("cacert", "cert", "private_key")}
    if (tls_files["cert"] is None) != (tls_files["private_key"] is None):
        raise InventoryError("switch.cert and switch.private_key go together (the controller's "
                             "certificate for mutual TLS): give both or neither")
    tls = ClientTls(**tls_files) if any(tls_files.values()) else None
    insecure = t.get("insecure", False)
    if not isinstance(insecure, bool):
        raise InventoryError(f"switch.insecure = {insecure!r}: write true or false")
    return SwitchInfo(grpc_addr, device_id, election, target, p4info, device_config,
                      data_ipv4, data_mac, udp, tls, insecure)


def _pool(t: Mapping[str, Any]) -> Pool:
    no_unknown_keys(t, _POOL_KEYS, "[pool]")
    base = int_field(t, "slot_base", 0, wire.NUM_SLOTS - 1, f"0..{wire.NUM_SLOTS - 1}", default=0,
                field="pool.slot_base")
    count = int_field(t, "slot_count", 1, wire.NUM_SLOTS, f"1..{wire.NUM_SLOTS}",
                 default=wire.NUM_SLOTS - base, field="pool.slot_count")
    if base + count > wire.NUM_SLOTS:
        raise InventoryError(f"pool.slot_base + pool.slot_count = {base + count} exceeds the "
                             f"switch's {wire.NUM_SLOTS} slots: lower pool.slot_count to at "
                             f"most {wire.NUM_SLOTS - base}")
    job = int_field(t, "job_slots", 1, count, f"1..{count} (the pool's slot_count)", default=min(
        256, count), field="pool.job_slots")
    avg = int_field(t, "averaging_slots", 1, count, f"1..{count}", default=min(64, count),
               field="pool.averaging_slots")
    if job + avg > count:
        raise InventoryError(f"pool.job_slots + pool.averaging_slots = {job + avg} exceed "
                             f"pool.slot_count = {count}: a job needs both; lower them or "
                             "raise slot_count")
    return Pool(base, count, job, avg)


def _hosts(raw: Any, fabric: Fabric | None = None) -> tuple[Host, ...]:
    if not isinstance(raw, list) or not raw:
        raise InventoryError("hosts is missing or empty: add one [[hosts]] table per server "
                             "with name, interface, ipv4, mac, switch_port")
    if fabric is not None:
        return _fabric_hosts(raw, fabric)
    if len(raw) > wire.MAX_WORKERS:
        raise InventoryError(f"{len(raw)} hosts: a job has at most {wire.MAX_WORKERS} members; "
                             "split the testbed into inventories of 32 hosts")
    hosts: list[Host] = []
    seen: dict[tuple[str, str], str] = {}
    for where, item in tables(raw, "hosts", _HOST_KEYS, InventoryError):
        name = _string(item, f"{where}.name", "name", 'e.g. name = "h1"')
        interface = _string(item, f"{where}.interface", "interface", 'e.g. interface = "eth1"')
        ipv4 = _ipv4(item, "ipv4", where)
        mac = _mac(item, "mac", where)
        port = int_field(item, "switch_port", 0, MAX_SWITCH_PORT, f"0..{MAX_SWITCH_PORT}",
                    field=f"{where}.switch_port")
        host = Host(name, interface, ipv4, mac, port)
        for field, value in (("name", name), ("mac", mac), ("switch_port", port),
                             ("ipv4", ipv4)):
            if field == "ipv4" and _loopback(ipv4):
                continue  # hosts emulated on one machine share 127.0.0.1
            other = seen.get((field, str(value)))
            if other is not None:
                raise InventoryError(f"{where}.{field} = {value!r} is also {other}.{field}: "
                                     f"every host needs its own {field}")
            seen[(field, str(value))] = where
        hosts.append(host)
    return tuple(hosts)


def _fabric_hosts(raw: list[Any], fabric: Fabric) -> tuple[Host, ...]:
    """Hosts behind leaves: names, MACs and addresses unique over the testbed, switch ports
    unique per leaf."""
    if len(raw) > MAX_FABRIC_HOSTS:
        raise InventoryError(f"{len(raw)} hosts: a job across leaves has at most "
                             f"{MAX_FABRIC_HOSTS} (a RESULT's count byte); split the testbed")
    leaf_names = [lf.name for lf in fabric.leaves]
    leaf_of: dict[str, str] = {}
    hosts: list[Host] = []
    for where, item in tables(raw, "hosts", _FABRIC_HOST_KEYS, InventoryError):
        name = _string(item, f"{where}.name", "name", 'e.g. name = "h1"')
        leaf = item.get("leaf")
        if isinstance(leaf, list):
            raise InventoryError(f"{where}.leaf = {leaf!r}: a host sits behind one leaf; "
                                 "name one of " + ", ".join(leaf_names))
        if leaf not in leaf_names:
            raise InventoryError(f"{where}.leaf = {leaf!r} is not a leaf of the testbed: name "
                                 "the one it sits behind, one of " + ", ".join(leaf_names))
        if leaf_of.get(name, leaf) != leaf:
            raise InventoryError(f"host {name!r} is behind leaf {leaf_of[name]!r} and leaf "
                                 f"{leaf!r}: a host sits behind one leaf; list it once")
        leaf_of[name] = leaf
        (host,) = _hosts([{k: v for k, v in item.items() if k != "leaf"}])
        hosts.append(Host(host.name, host.interface, host.ipv4, host.mac, host.switch_port,
                          leaf))
    for leaf in leaf_names:  # per leaf: its ports and, off loopback, its addresses
        behind = [h for h in hosts if h.leaf == leaf]
        if len(behind) > wire.MAX_WORKERS:
            raise InventoryError(f"{len(behind)} hosts behind leaf {leaf!r}: a leaf's job has "
                                 f"at most {wire.MAX_WORKERS} members; move some to another leaf")
        _hosts([_host_table(h) for h in behind])
    _unique_over_testbed(hosts)
    return tuple(hosts)


def _host_table(h: Host) -> dict[str, Any]:
    return {"name": h.name, "interface": h.interface, "ipv4": h.ipv4, "mac": h.mac,
            "switch_port": h.switch_port}


def _unique_over_testbed(hosts: list[Host]) -> None:
    seen: dict[tuple[str, str], str] = {}
    for h in hosts:
        for field, value in (("name", h.name), ("mac", h.mac), ("ipv4", h.ipv4)):
            if field == "ipv4" and _loopback(value):
                continue
            other = seen.get((field, value))
            if other is not None:
                raise InventoryError(f"hosts {other!r} and {h.name!r} have the same {field} "
                                     f"{value!r}: every host needs its own {field}")
            seen[(field, value)] = h.name


# ------------------------------------------------------------------ fields
def _string(t: Mapping[str, Any], field: str, key: str, hint: str) -> str:
    value = t.get(key)
    if not isinstance(value, str) or not value.strip():
        raise InventoryError(f"{field} is missing or not a non-empty string: {hint}")
    return value


def _ipv4(t: Mapping[str, Any], key: str, where: str, default: str | None = None) -> str:
    value = t.get(key, default)
    try:
        if not isinstance(value, str):
            raise ValueError
        return str(ipaddress.IPv4Address(value))
    except ValueError:
        raise InventoryError(f"{where}.{key} = {value!r} is not an IPv4 address: write it as "
                             'e.g. "10.0.0.1"') from None


def _mac(t: Mapping[str, Any], key: str, where: str, default: str | None = None) -> str:
    value = t.get(key, default)
    try:
        if not isinstance(value, str) or len(wire.mac_to_bytes(value)) != 6:
            raise ValueError
    except ValueError:
        raise InventoryError(f"{where}.{key} = {value!r}: give six hex bytes separated by ':', "
                             'e.g. "02:00:00:00:01:01"') from None
    return wire.bytes_to_mac(wire.mac_to_bytes(value))


def _file(t: Mapping[str, Any], key: str, base: Path, *, required: bool) -> Path | None:
    value = t.get(key)
    if value is None or value == "":
        if required:
            raise InventoryError(
                f"switch.{key} is missing: give the path of the "
                + ("text P4Info (hysync:p4src/v1model/hysync.p4info.txtpb)" if key == "p4info" else
                   f"compiled program for target {t.get('target')} (BMv2: build/p4/"
                   "hysync.json from `make p4`)"))
        return None
    if not isinstance(value, str):
        raise InventoryError(f"switch.{key} = {value!r} must be a path (a string)")
    try:  # `hysync:p4src/...`: a file shipped with HySync, wherever it is installed
        path = resources.resolve(value, base)
    except FileNotFoundError as err:
        raise InventoryError(f"switch.{key} = {value!r}: {err}") from None
    if not path.is_file():
        raise InventoryError(f"switch.{key} = {value!r}: {path} does not exist; paths are "
                             "relative to the inventory file, or hysync:RELATIVE for a "
                             "file HySync ships")
    return path


def _loopback(ipv4: str) -> bool:
    return ipaddress.IPv4Address(ipv4).is_loopback
