"""The emulated networks' addressing plan (Mininet stars, namespace racks, the benches):
worker w is host h(w+1) at 10.0.0.(w+1); the switch answers at 10.0.0.254. Free of
Mininet, so that `hysync rack` and the benches run where Mininet is not installed."""

SWITCH_MAC = "02:00:00:00:00:fe"  # the address workers send HySync traffic to
SWITCH_IP = "10.0.0.254"


def host_ip(worker: int) -> str:
    return f"10.0.0.{worker + 1}"


def host_mac(worker: int) -> str:
    return f"02:00:00:00:01:{worker + 1:02x}"
