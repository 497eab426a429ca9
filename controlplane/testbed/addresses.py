"""The emulated networks' addressing plan (Mininet stars, namespace racks, the benches):
worker w is host h(w+1) at 10.0.0.(w+1); the switch answers at 10.0.0.254. Free of
Mininet, so that `hysync rack` and the benches run where Mininet is not installed."""

import os
import re
import subprocess
import threading

SWITCH_MAC = "02:00:00:00:00:fe"  # the address workers send HySync traffic to
SWITCH_IP = "10.0.0.254"


def host_ip(worker: int) -> str:
    return f"10.0.0.{worker + 1}"


def host_mac(worker: int) -> str:
    return f"02:00:00:00:01:{worker + 1:02x}"


_LINK_LOCAL = "169.254"
# `hysync rack up`'s management network, fixed so that its inventory and docs can name it
RACK_MANAGEMENT_NET = f"{_LINK_LOCAL}.99"
# `hysync rack up N --racks R`'s: one /30 per switch (spine first, then each leaf)
FABRIC_MANAGEMENT_NET = f"{_LINK_LOCAL}.98"
# never handed out: the racks', and a cloud's metadata service (169.254.169.254)
_RESERVED = {98, 99, 169}
_handed_out: set[int] = set()
_handing_out = threading.Lock()


def free_management_net() -> str:
    """A link-local prefix "169.254.X" for an emulated switch's management link that no
    address of this network namespace uses and this process has not handed out before,
    so that two switches of one process (a conformance BMv2 beside an emulated rack)
    never answer at the same address. The search starts at a point drawn from the pid so
    that parallel processes rarely race for the same X."""
    shown = subprocess.run(["ip", "-4", "-o", "addr", "show"], capture_output=True, text=True,
                           check=True).stdout
    used = {int(x) for x in re.findall(rf"inet {re.escape(_LINK_LOCAL)}\.(\d+)\.", shown)}
    start = os.getpid() % 254
    with _handing_out:
        for i in range(254):
            x = (start + i) % 254 + 1
            if x not in used and x not in _handed_out and x not in _RESERVED:
                _handed_out.add(x)
                return f"{_LINK_LOCAL}.{x}"
    raise RuntimeError(f"every {_LINK_LOCAL}.X.0/24 is in use in this network namespace: "
                       "remove the stale management links that `ip -4 addr show` lists")
