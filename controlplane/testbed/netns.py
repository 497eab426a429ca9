"""Hosts in network namespaces behind a switch namespace: the emulated rack of
`hysync rack up` and of the frame benches.

`NetnsStar` builds (and `close()` removes exactly) this layout, every name tagged with
`tag` (default hb<pid>, so that parallel runs never collide):

    namespace <tag>-h1 .. h4              namespace <tag>-sw
    <tag>h1 10.0.0.1/24  <-- veth -->     <tag>s1 ... <tag>s4   (switch ports 1..4)
    root namespace
    <tag>m 169.254.X.1/30 <-- veth -->    <tag>n 169.254.X.2/30   (P4Runtime on :9559)

The switch (BMv2 or the softswitch's raw data plane) runs in its own namespace
(BMv2's thrift server binds 0.0.0.0:9090) and is reached over the link-local
management /30. With `host_management`, every host namespace has a management /30 to
the switch namespace too (<tag>a1 169.254.X.5 <-> <tag>b1 169.254.X.6, ...) and a
route to the switch's P4Runtime address over it, as servers on a rack's management
network have (`hysync deploy --check` run on a host).

Offloads are off on every data veth end (a user-space switch never fills in
checksums); IPv6 is off before link-up (the kernel would send router solicitations
the switch floods). Each host has the switch's address 10.0.0.254 ->
02:00:00:00:00:fe as a static neighbour and the MAC `addresses.host_mac(w)`.
"""

from __future__ import annotations

import os
import shutil
import subprocess

from hysync.controlplane.testbed.addresses import (
    SWITCH_IP,
    SWITCH_MAC,
    free_management_net,
    host_ip,
    host_mac,
)


def missing_netns_tools(why: str) -> str | None:
    """Why network namespaces with veth links cannot be built here (None: they can);
    `why` says what needs them, for the skip reason."""
    if os.geteuid() != 0:
        return f"needs root: {why}"
    for tool, package in (("ip", "iproute2"), ("ethtool", "ethtool")):
        if shutil.which(tool) is None:
            return f"needs `{tool}` (apt-get install {package})"
    return None


def _sh(*cmd: str) -> None:
    done = subprocess.run(cmd, capture_output=True, text=True)
    if done.returncode != 0:
        raise RuntimeError(f"{' '.join(cmd)}: {done.stderr.strip() or done.returncode}")


def exec_in(ns: str) -> list[str]:
    """The command prefix that runs a command inside namespace `ns`."""
    return ["ip", "netns", "exec", ns]


def add_netns(name: str, made: list[str]) -> None:
    """A namespace with IPv6 off (no router solicitations on the data links) and lo up,
    named in `made` as soon as it exists (what a failed build removes; never one it did
    not make)."""
    _sh("ip", "netns", "add", name)
    made.append(name)
    inns = exec_in(name)
    _sh(*inns, "sysctl", "-q", "-w", "net.ipv6.conf.all.disable_ipv6=1")
    _sh(*inns, "sysctl", "-q", "-w", "net.ipv6.conf.default.disable_ipv6=1")
    _sh(*inns, "ip", "link", "set", "lo", "up")


class NetnsLayout:
    """Namespaces and veths that a layout builds (`_build`) and removes exactly: every
    namespace it made and the root-namespace end of each veth still there, named as soon
    as it exists, so that a failed build, `close()`, or `remove` in another process (from
    `created()`: `hysync rack down`) deletes what it made and never anything else."""

    def __init__(self) -> None:
        self._namespaces: list[str] = []
        self._links: list[str] = []  # root-namespace ends of veths still in the root namespace

    def _build(self) -> None:
        raise NotImplementedError

    def _build_or_remove(self) -> None:
        """`_build`; on any failure what it made so far is removed."""
        try:
            self._build()
        except BaseException:
            self.close()
            raise

    @staticmethod
    def exec_in(ns: str) -> list[str]:
        return exec_in(ns)

    def _netns(self, name: str) -> None:
        add_netns(name, self._namespaces)

    @staticmethod
    def _offloads_off(inns: list[str], ifname: str) -> None:
        _sh(*inns, "ethtool", "-K", ifname, "tx", "off", "tso", "off", "gso", "off", "rx", "off")

    def created(self) -> dict[str, list[str]]:
        """What this instance made, for `remove` in another process (`hysync rack down`)."""
        return {"namespaces": list(self._namespaces), "links": list(self._links)}

    def close(self) -> None:
        """Delete what this instance made (deleting a namespace deletes its veths)."""
        remove(self._namespaces, self._links)
        self._links.clear()
        self._namespaces.clear()


class NetnsStar(NetnsLayout):
    """`hosts` sender namespaces, each on its own port (1..hosts) of a switch namespace."""

    def __init__(self, hosts: int = 4, *, host_management: bool = False,
                 tag: str | None = None, net: str | None = None) -> None:
        pid = os.getpid()
        self.tag = tag or f"hb{pid}"
        self.hosts = [f"{self.tag}-h{p}" for p in range(1, hosts + 1)]
        self.switch_ns = f"{self.tag}-sw"
        self.host_ifs = [f"{self.tag}h{p}" for p in range(1, hosts + 1)]
        self.switch_ifs = {p: f"{self.tag}s{p}" for p in range(1, hosts + 1)}
        self.mgmt_root, self.mgmt_switch = f"{self.tag}m", f"{self.tag}n"
        net = net or free_management_net()
        self.mgmt_root_ip, self.mgmt_switch_ip = f"{net}.1", f"{net}.2"
        self.grpc_addr = f"{self.mgmt_switch_ip}:9559"
        self._net, self._host_management = net, host_management
        super().__init__()
        self._build_or_remove()

    def _build(self) -> None:
        self._netns(self.switch_ns)
        sw = self.exec_in(self.switch_ns)
        for w, (host, hif) in enumerate(zip(self.hosts, self.host_ifs, strict=True)):
            sif = self.switch_ifs[w + 1]
            self._netns(host)
            hns = self.exec_in(host)
            _sh("ip", "link", "add", hif, "type", "veth", "peer", "name", sif)
            self._links.append(hif)
            _sh("ip", "link", "set", sif, "netns", self.switch_ns)
            _sh("ip", "link", "set", hif, "netns", host)
            self._links.remove(hif)
            for inns, ifname in ((hns, hif), (sw, sif)):
                _sh(*inns, "sysctl", "-q", "-w", f"net.ipv6.conf.{ifname}.disable_ipv6=1")
                self._offloads_off(inns, ifname)
            _sh(*hns, "ip", "link", "set", hif, "address", host_mac(w))
            _sh(*hns, "ip", "addr", "add", f"{host_ip(w)}/24", "dev", hif)
            _sh(*hns, "ip", "link", "set", hif, "up")
            _sh(*sw, "ip", "link", "set", sif, "up")
            _sh(*hns, "ip", "neigh", "replace", SWITCH_IP, "lladdr", SWITCH_MAC, "dev", hif)
        _sh("ip", "link", "add", self.mgmt_root, "type", "veth", "peer", "name", self.mgmt_switch)
        self._links.append(self.mgmt_root)
        _sh("ip", "link", "set", self.mgmt_switch, "netns", self.switch_ns)
        _sh("ip", "addr", "add", f"{self.mgmt_root_ip}/30", "dev", self.mgmt_root)
        _sh("ip", "link", "set", self.mgmt_root, "up")
        _sh(*sw, "ip", "addr", "add", f"{self.mgmt_switch_ip}/30", "dev", self.mgmt_switch)
        _sh(*sw, "ip", "link", "set", self.mgmt_switch, "up")
        if self._host_management:
            for p, host in enumerate(self.hosts, start=1):
                self._host_management_link(p, host)

    def _host_management_link(self, p: int, host: str) -> None:
        """A /30 from host namespace `p` to the switch namespace, and over it a route to
        the switch's P4Runtime address (the switch's kernel answers for any local address)."""
        here, there = f"{self.tag}a{p}", f"{self.tag}b{p}"
        host_ip, switch_ip = f"{self._net}.{4 * p + 1}", f"{self._net}.{4 * p + 2}"
        _sh("ip", "link", "add", here, "type", "veth", "peer", "name", there)
        self._links.append(here)
        _sh("ip", "link", "set", there, "netns", self.switch_ns)
        _sh("ip", "link", "set", here, "netns", host)
        self._links.remove(here)
        for ns, ifname, ip in ((host, here, host_ip), (self.switch_ns, there, switch_ip)):
            _sh(*self.exec_in(ns), "ip", "addr", "add", f"{ip}/30", "dev", ifname)
            _sh(*self.exec_in(ns), "ip", "link", "set", ifname, "up")
        _sh(*self.exec_in(host), "ip", "route", "add", f"{self.mgmt_switch_ip}/32", "via",
            switch_ip)


def remove(namespaces: list[str], links: list[str]) -> None:
    """Delete these root-namespace links and namespaces (and with them their veths)."""
    for link in reversed(links):
        subprocess.run(["ip", "link", "del", link], capture_output=True)
    for ns in reversed(namespaces):
        subprocess.run(["ip", "netns", "del", ns], capture_output=True)
