"""Fixtures of the operator's-view tests: a deployed loopback testbed, a running serve with
/metrics, and sender threads that run a job's rounds through the real softswitch."""

from __future__ import annotations

import io
import socket
import urllib.request
from collections.abc import Callable, Iterator
from dataclasses import dataclass

import pytest
from prometheus_client.parser import text_string_to_metric_families

from hysync.controlplane.cli.main import main
from hysync.controlplane.serve.server import Server
from hysync.controlplane.testbed.inventory import Inventory
from tests.controlplane.conftest import Softswitch, free_udp_socket, softswitch  # noqa: F401
from tests.controlplane.senders import Sender, Shared
from tests.testbed.conftest import inventory_for, published  # noqa: F401

Samples = dict[tuple[str, frozenset[tuple[str, str]]], float]


def hysync(*args: str) -> tuple[int, str, str]:
    out, err = io.StringIO(), io.StringIO()
    code = main(list(args), stdout=out, stderr=err)
    return code, out.getvalue(), err.getvalue()


def scrape(address: str) -> Samples:
    """Every sample of http://ADDRESS/metrics, by (name, labels)."""
    with urllib.request.urlopen(f"http://{address}/metrics", timeout=10) as reply:
        text = reply.read().decode()
    return {(s.name, frozenset(s.labels.items())): s.value
            for family in text_string_to_metric_families(text) for s in family.samples}


def value(samples: Samples, name: str, **labels: str) -> float:
    """The sum of the samples of `name` whose labels include `labels`."""
    want = set(labels.items())
    found = [v for (n, ls), v in samples.items() if n == name and want <= ls]
    assert found, f"no sample {name}{labels} in the scrape"
    return sum(found)


@pytest.fixture
def deployed(inventory_for, softswitch: Softswitch) -> Inventory:  # noqa: F811
    path = inventory_for(softswitch, hosts=3)
    code, _, err = hysync("deploy", str(path))
    assert code == 0, err
    return Inventory.load(path)


@pytest.fixture
def serve(deployed: Inventory) -> Iterator[Callable[..., Server]]:
    servers: list[Server] = []

    def make(**options: object) -> Server:
        server = published(Server(deployed, **options).start())  # type: ignore[arg-type]
        servers.append(server)
        return server
    yield make
    for server in servers:
        server.close()


@dataclass
class Workers:
    """Sender threads, one per member, on their own UDP sockets."""

    socks: list[socket.socket]
    shared: Shared
    senders: list[Sender]

    def members(self) -> list[dict[str, object]]:
        return [{"worker": w, "host": f"h{w + 1}", "udp_port": s.getsockname()[1]}
                for w, s in enumerate(self.socks)]

    def start(self, job_id: int, slots: range, switch: tuple[str, int]) -> None:
        self.senders = [Sender(job_id, w, s, switch, slots, self.shared, give_up_after=120)
                        for w, s in enumerate(self.socks)]
        for sender in self.senders:
            sender.start()


@pytest.fixture
def workers() -> Iterator[Callable[[int], Workers]]:
    made: list[Workers] = []

    def make(n: int) -> Workers:
        w = Workers([free_udp_socket() for _ in range(n)], Shared(), [])
        made.append(w)
        return w
    yield make
    for w in made:
        w.shared.stop.set()
        for sender in w.senders:
            sender.join(timeout=10)
        for s in w.socks:
            s.close()
