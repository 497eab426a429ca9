"""`hysync top` over a running job: from serve's /metrics, and from the switch directly."""

from __future__ import annotations

import json
import time

from hysync.controlplane.serve.client import ServeClient
from hysync.controlplane.serve.prometheus_collector import serve_metrics
from tests.controlplane.conftest import Softswitch

from .conftest import hysync


def test_top_shows_the_jobs_modes_pace_and_drops(deployed, serve, workers,
                                                 softswitch: Softswitch) -> None:  # type: ignore[no-untyped-def]
    server = serve(policy=None)  # the operator's mode stays (a policy may swap it back)
    endpoint = serve_metrics(server, "127.0.0.1:0")
    team = workers(3)
    try:
        with ServeClient(server.address) as client:
            # each member a host of two ranks, as `attach` admits hosts of several GPUs
            members = [dict(m, ranks=[2 * i, 2 * i + 1]) for i, m in enumerate(team.members())]
            job = client.request({"op": "admit", "members": members})["jobs"][0]
            job_id, base = job["job_id"], job["slot_base"]
            team.start(job_id, range(base, base + 8), softswitch.udp_addr)
            client.request({"op": "mode_set", "job": job_id, "mode": "partial", "quorum": 2})
            time.sleep(1.0)
            code, out, err = hysync("--json", "top", "--metrics", endpoint.address,
                                    "--count", "2", "--interval", "0.5")
            assert (code, err) == (0, "")
            frames = [json.loads(line) for line in out.splitlines()]
            assert len(frames) == 2
            (shown,) = [j for j in frames[1]["jobs"] if j["job_id"] == job_id]
            assert shown["modes"] == [{"slots": f"{base}-{base + 31}", "mode": "partial",
                                       "quorum": 2}]
            assert shown["rounds_per_s"] > 0 and shown["swaps"] == 1
            assert all(m["pace"] > 0 and m["state"] == "healthy" for m in shown["members"])
            assert [m["worker"] for m in shown["members"]] == [0, 1, 2]
            assert [(m["host"], m["ranks"]) for m in shown["members"]] == [
                ("h1", "0, 1"), ("h2", "2, 3"), ("h3", "4, 5")]

            code, out, err = hysync("top", "--metrics", endpoint.address, "--count", "2",
                                    "--interval", "0.3")
            assert (code, err) == (0, "")
            assert f"job {job_id}: {base}-{base + 31} partial(2); rounds/s " in out
            assert "worker" in out and "contrib/s" in out and "switch drops" in out
            assert "ranks" in out and "4, 5" in out

            # without serve's metrics: the switch itself, read without arbitrating
            code, out, err = hysync("--grpc-addr", deployed.switch.grpc_addr, "--json", "top",
                                    "--count", "1")
            assert (code, err) == (0, "")
            (direct,) = [j for j in json.loads(out)["jobs"] if j["job_id"] == job_id]
            assert direct["modes"][0]["mode"] == "partial"
            assert {m["host"] for m in direct["members"]} == {""}  # only serve knows hosts
    finally:
        endpoint.close()


def test_top_without_a_metrics_endpoint_is_one_line(deployed) -> None:  # type: ignore[no-untyped-def]
    code, out, err = hysync("top", "--metrics", "127.0.0.1:1", "--count", "1")
    assert (code, out) == (1, "")
    assert err.count("\n") == 1 and "cannot read metrics at http://127.0.0.1:1/metrics" in err
