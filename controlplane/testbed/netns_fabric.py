"""Racks of hosts in network namespaces behind leaf switch namespaces and a spine namespace:
the emulated two-level cluster of `hysync rack up N --racks R` (docs/testbed.md).

`NetnsFabric` builds (and `close()` removes exactly) this layout, every name tagged with
`tag`, racks r = 1..R of hosts h = 1..N:

    host namespace <tag>-r<r>h<h>         leaf namespace <tag>-l<r>
    <tag>r<r>h<h> 10.0.<r>.<h> <-veth->   <tag>r<r>s<h>  (leaf port h)
                                          <tag>r<r>u     (leaf port N+1)
                                             <-veth->  <tag>r<r>d  (spine port r, in <tag>-sp)
    <tag>r<r>f<h> 10.1.0.<k>  <-veth->  <tag>r<r>g<h> on the bridge <tag>fe (in <tag>-fe)
    switch i's <tag>k<i> 10.1.0.(250-i) <-veth-> <tag>j<i> on the bridge <tag>fe
    root namespace <tag>m<i> 169.254.98.(4i+1)/30 <-veth-> <tag>n<i> 169.254.98.(4i+2)/30
        in switch i's namespace (i = 0 the spine, i = r leaf r): its P4Runtime address
        (another 169.254.X where a cluster holds 169.254.98: `management_net`)

(<r>, <h> from 1; <k> numbers the hosts from 1, rack by rack.) The data veths (host <->
leaf, leaf <-> spine) carry HySync's packets through the softswitches' raw data planes;
offloads are off on every end (a user-space switch fills in no checksums) and IPv6 is off
before link-up (the kernel would send router solicitations the switches flood). Each host
knows its leaf's data address 10.0.<r>.254 as a static neighbour. The front-end bridge
carries what is not HySync's, as a cluster's Ethernet front-end network does: torchrun's
rendezvous, gloo's process group, and the ranks' P4Runtime sessions (a rank leaves its job
at every level when its training is done; each host routes every switch's P4Runtime
address via that switch's front-end address, whose kernel answers for it). The switches of
a job across leaves and a spine forward HySync's packets only (no switch of it is deployed
with L2 entries for the hosts).
"""

from __future__ import annotations

import re
import subprocess

from hysync.controlplane.testbed.addresses import FABRIC_MANAGEMENT_NET, free_management_net
from hysync.controlplane.testbed.netns import NetnsLayout, _sh

SPINE_IP = "10.0.0.254"
SPINE_MAC = "02:00:00:00:00:f1"
FRONT_END_NET = "10.1.0"
GRPC_PORT = 9559


def host_ip(rack: int, host: int) -> str:
    """Host `host` (0-based) of rack `rack` (0-based) on its leaf's data network."""
    return f"10.0.{rack + 1}.{host + 1}"


def host_mac(rack: int, host: int) -> str:
    return f"02:00:00:01:{rack + 1:02x}:{host + 1:02x}"


def leaf_ip(rack: int) -> str:
    return f"10.0.{rack + 1}.254"


def leaf_mac(rack: int) -> str:
    return f"02:00:00:00:{rack + 1:02x}:fe"


def switch_data(switch: int) -> tuple[str, str]:
    """Switch `switch`'s data address and MAC: 0 the spine, r + 1 the leaf of rack r."""
    return (SPINE_IP, SPINE_MAC) if switch == 0 else (leaf_ip(switch - 1), leaf_mac(switch - 1))


def front_end_ip(index: int) -> str:
    """The front-end address of the index-th host of the cluster (rack by rack)."""
    return f"{FRONT_END_NET}.{index + 1}"


def switch_front_end_ip(switch: int) -> str:
    """Switch `switch`'s address on the front-end network (0 the spine, r + 1 leaf r)."""
    return f"{FRONT_END_NET}.{250 - switch}"


def grpc_addr(switch: int, net: str = FABRIC_MANAGEMENT_NET) -> str:
    """Switch `switch`'s P4Runtime address: 0 the spine, r + 1 the leaf of rack r."""
    return f"{net}.{4 * switch + 2}:{GRPC_PORT}"


def management_net() -> str:
    """169.254.98, the cluster's management network, unless an address of this namespace
    is in it (another cluster is up): then a free 169.254.X, so that two clusters side by
    side never answer P4Runtime at the same address."""
    shown = subprocess.run(["ip", "-4", "-o", "addr", "show"], capture_output=True, text=True,
                           check=True).stdout
    if re.search(rf"inet {re.escape(FABRIC_MANAGEMENT_NET)}\.", shown):
        return free_management_net()
    return FABRIC_MANAGEMENT_NET


class NetnsFabric(NetnsLayout):
    """`racks` leaf namespaces of `hosts` host namespaces each, the leaves on a spine
    namespace, the hosts on a front-end bridge."""

    def __init__(self, racks: int, hosts: int, *, tag: str,
                 net: str = FABRIC_MANAGEMENT_NET) -> None:
        self.tag, self.racks, self.per_rack, self.net = tag, racks, hosts, net
        self.spine_ns, self.front_end_ns = f"{tag}-sp", f"{tag}-fe"
        self.leaf_ns = [f"{tag}-l{r + 1}" for r in range(racks)]
        self.host_ns = [[f"{tag}-r{r + 1}h{h + 1}" for h in range(hosts)] for r in range(racks)]
        self.host_ifs = [[f"{tag}r{r + 1}h{h + 1}" for h in range(hosts)] for r in range(racks)]
        self.front_end_ifs = [[f"{tag}r{r + 1}f{h + 1}" for h in range(hosts)]
                              for r in range(racks)]
        self.uplink_port = hosts + 1
        # switch namespace -> {port: interface}, what its softswitch's -i maps
        self.ports: dict[str, dict[int, str]] = {
            self.spine_ns: {r + 1: f"{tag}r{r + 1}d" for r in range(racks)},
            **{ns: {**{h + 1: f"{tag}r{r + 1}s{h + 1}" for h in range(hosts)},
                    self.uplink_port: f"{tag}r{r + 1}u"}
               for r, ns in enumerate(self.leaf_ns)}}
        super().__init__()
        self._build_or_remove()

    @property
    def switch_namespaces(self) -> list[str]:
        """The spine's namespace, then each leaf's: switch i answers at grpc_addr(i)."""
        return [self.spine_ns, *self.leaf_ns]

    def softswitch_ports(self, ns: str) -> list[str]:
        """The `-i PORT@INTERFACE` arguments of the softswitch in switch namespace `ns`."""
        return [a for p, ifname in sorted(self.ports[ns].items()) for a in ("-i", f"{p}@{ifname}")]

    def _veth(self, a: str, a_ns: str | None, b: str, b_ns: str, *, data: bool) -> None:
        """A veth a <-> b, a in a_ns (None: the root namespace), b in b_ns, both up; a data
        veth has its offloads off at both ends."""
        _sh("ip", "link", "add", a, "type", "veth", "peer", "name", b)
        self._links.append(a)
        _sh("ip", "link", "set", b, "netns", b_ns)
        if a_ns is not None:
            _sh("ip", "link", "set", a, "netns", a_ns)
            self._links.remove(a)
        for ns, ifname in ((a_ns, a), (b_ns, b)):
            inns = self.exec_in(ns) if ns else []
            if data:
                _sh(*inns, "sysctl", "-q", "-w", f"net.ipv6.conf.{ifname}.disable_ipv6=1")
                self._offloads_off(inns, ifname)
            _sh(*inns, "ip", "link", "set", ifname, "up")

    def _build(self) -> None:
        for ns in (self.spine_ns, *self.leaf_ns, self.front_end_ns):
            self._netns(ns)
        fe = self.exec_in(self.front_end_ns)
        bridge = f"{self.tag}fe"
        _sh(*fe, "ip", "link", "add", bridge, "type", "bridge")
        _sh(*fe, "ip", "link", "set", bridge, "up")
        for i, ns in enumerate(self.switch_namespaces):
            root_if, switch_if = f"{self.tag}m{i}", f"{self.tag}n{i}"
            self._veth(root_if, None, switch_if, ns, data=False)
            _sh("ip", "addr", "add", f"{self.net}.{4 * i + 1}/30", "dev", root_if)
            _sh(*self.exec_in(ns), "ip", "addr", "add", f"{self.net}.{4 * i + 2}/30",
                "dev", switch_if)
        for i, ns in enumerate(self.switch_namespaces):
            # the switch on the front-end network too: the ranks on the hosts reach its
            # P4Runtime address over it (a rank leaves its job when its training is done)
            switch_if, bridge_port = f"{self.tag}k{i}", f"{self.tag}j{i}"
            self._veth(switch_if, ns, bridge_port, self.front_end_ns, data=False)
            _sh(*fe, "ip", "link", "set", bridge_port, "master", bridge)
            _sh(*self.exec_in(ns), "ip", "addr", "add", f"{switch_front_end_ip(i)}/24",
                "dev", switch_if)
        index = 0
        for r, leaf_ns in enumerate(self.leaf_ns):
            self._veth(self.ports[leaf_ns][self.uplink_port], leaf_ns,
                       self.ports[self.spine_ns][r + 1], self.spine_ns, data=True)
            for h, ns in enumerate(self.host_ns[r]):
                self._netns(ns)
                hif, inns = self.host_ifs[r][h], self.exec_in(ns)
                self._veth(hif, ns, self.ports[leaf_ns][h + 1], leaf_ns, data=True)
                _sh(*inns, "ip", "link", "set", hif, "address", host_mac(r, h))
                _sh(*inns, "ip", "addr", "add", f"{host_ip(r, h)}/24", "dev", hif)
                _sh(*inns, "ip", "neigh", "replace", leaf_ip(r), "lladdr", leaf_mac(r),
                    "dev", hif)
                fif, bridge_port = self.front_end_ifs[r][h], f"{self.tag}r{r + 1}g{h + 1}"
                self._veth(fif, ns, bridge_port, self.front_end_ns, data=False)
                _sh(*fe, "ip", "link", "set", bridge_port, "master", bridge)
                _sh(*inns, "ip", "addr", "add", f"{front_end_ip(index)}/24", "dev", fif)
                for i in range(len(self.switch_namespaces)):
                    _sh(*inns, "ip", "route", "add",
                        f"{grpc_addr(i, self.net).rpartition(':')[0]}/32", "via",
                        switch_front_end_ip(i))
                index += 1
