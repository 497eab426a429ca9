"""Mininet topologies of HySync jobs. Usable from `mn --custom topologies/topo.py --topo star`."""

from __future__ import annotations

from mininet.topo import Topo

from hysync.controlplane.testbed.addresses import host_ip, host_mac


class StarTopo(Topo):
    """N worker hosts h1..hN, each on its own port of one switch s1 (port w+1 for worker w)."""

    def build(self, n_workers: int = 4,  # noqa: D417 (one parameter per line below)
              bandwidth_mbit: float | None = None) -> None:
        """
        n_workers: worker hosts, 2..32 (the contributor bitmap is 32 bits).
        bandwidth_mbit: per-link bandwidth (tc htb); None for unshaped links.
        """
        if not 2 <= n_workers <= 32:
            raise ValueError(f"n_workers = {n_workers}: a star has 2..32 workers")
        switch = self.addSwitch("s1")
        for w in range(n_workers):
            host = self.addHost(f"h{w + 1}", ip=f"{host_ip(w)}/24", mac=host_mac(w))
            link_opts = {} if bandwidth_mbit is None else {"bw": bandwidth_mbit}
            self.addLink(host, switch, port2=w + 1, **link_opts)


topos = {"star": StarTopo}
