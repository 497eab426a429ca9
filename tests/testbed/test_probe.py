"""`hysync deploy --check` run on a host of the emulated rack (root): its port map check
pings every other host through the switch's data plane (ARP flooded, ICMP echo through
the l2 table), and tells a wrong port in the inventory, a missing l2 entry and a host
that is down apart - each reported, with a non-zero exit status."""

from __future__ import annotations

import subprocess
import sys
import tomllib
from pathlib import Path

import pytest

from hysync.controlplane.p4rt.entities import delete
from hysync.controlplane.p4rt.switch import Switch
from hysync.controlplane.tables import forwarding

from .conftest import RACK_HOSTS, ROOT, toml_text

pytestmark = pytest.mark.root
PROBE_WAIT_S = 5.0  # what an unanswered ARP or ping is given before it counts as not answered


def hysync_on(star, w: int, *args: str) -> subprocess.CompletedProcess:
    """`hysync ARGS` in host namespace `w`, as run on that host of the rack. The switch's
    P4Runtime answers get a generous deadline (the reference model's server shares its
    interpreter with the raw data plane, and on a busy machine both wait for a core); the
    probe's wait is what the unanswered cases below spend."""
    return subprocess.run([*star.exec_in(star.hosts[w]), sys.executable, "-m",
                           "hysync.controlplane.cli", "--timeout", "60", *args], cwd=ROOT,
                          capture_output=True, text=True, timeout=600)


def check_on(star, w: int, *args: str) -> tuple[int, dict[str, str]]:
    """`hysync deploy --check ARGS` on host `w`: (exit status, {check name: its line}).
    A check that could not run to its end (stderr says why) fails here, not as a line the
    test looks for and does not find."""
    done = hysync_on(star, w, "deploy", "--check", "--probe-wait", str(PROBE_WAIT_S), *args)
    lines = {ln[6:].split(":")[0]: ln for ln in done.stdout.splitlines()}
    assert "reachable" in lines and "probe" in lines, done.stdout + done.stderr
    return done.returncode, lines


def deploy(star, inventory: Path) -> None:
    done = hysync_on(star, 0, "deploy", str(inventory))
    assert done.returncode == 0, done.stdout + done.stderr


def test_every_host_answers_after_deploy_and_a_wrong_port_is_found(rack, tmp_path: Path) -> None:
    star, inventory = rack
    deploy(star, inventory)
    code, lines = check_on(star, 0, str(inventory))  # h1 found by itself
    assert code == 0, lines
    assert len(lines) == 4 + RACK_HOSTS
    assert lines["probe"].startswith(f"ok    probe: from h1 ({star.host_ifs[0]}, 10.0.0.1): "
                                     "2 of 2 hosts answered")
    assert lines["port map h1"].endswith("-> port 1, flooded; the probe's source")
    for h in ("h2", "h3"):
        assert lines[f"port map {h}"].startswith(f"ok    port map {h}: ")
        assert "answered ARP and a ping from h1 in" in lines[f"port map {h}"]

    # h2 and h3 swapped in the inventory: l2 agrees with it, only the probe can tell
    data = tomllib.loads(inventory.read_text())
    data["hosts"][1]["switch_port"], data["hosts"][2]["switch_port"] = 3, 2
    swapped = tmp_path / "swapped.toml"
    swapped.write_text(toml_text(data))
    deploy(star, swapped)
    code, lines = check_on(star, 0, "--from", "h1", str(swapped))
    assert code == 1, lines
    for h, port in (("h2", 3), ("h3", 2)):
        mac = f"02:00:00:00:01:0{h[1]}"
        assert lines[f"port map {h}"].startswith(
            f"FAIL  port map {h}: {mac} -> port {port}, flooded; answered ARP from h1 (flooded) "
            f"but not a ping sent to {mac}, which the switch sends to port {port}: {h} is not on "
            "that port - fix hosts.switch_port")
    assert lines["probe"].startswith("ok    probe: from h1") and "2 of 2" in lines["probe"]
    # from h2 nothing comes back: the switch sends h2's replies to port 3
    code, lines = check_on(star, 1, str(swapped))
    assert code == 1 and lines["probe"].startswith("FAIL  probe: from h2"), lines
    assert "no host answered" in lines["probe"] and "not on port 3" in lines["probe"]


def test_wrong_macs_a_missing_l2_entry_and_a_host_down_are_reported(rack,
                                                                   tmp_path: Path) -> None:
    star, inventory = rack
    deploy(star, inventory)
    data = tomllib.loads(inventory.read_text())
    data["hosts"][0]["mac"], data["hosts"][1]["mac"] = "02:00:00:00:01:0a", "02:00:00:00:01:0b"
    wrong = tmp_path / "wrong-macs.toml"
    wrong.write_text(toml_text(data))
    code, lines = check_on(star, 0, str(wrong))
    assert code == 1, lines
    assert lines["probe"] == (
        f"FAIL  probe: from h1 ({star.host_ifs[0]}, 10.0.0.1): the interface's MAC is "
        "02:00:00:00:01:01, the inventory's 02:00:00:00:01:0a: fix hosts.mac of h1, then "
        "`hysync deploy`")
    assert lines["port map h2"].endswith(
        "; 10.0.0.2 answers ARP from 02:00:00:00:01:02, not the inventory's 02:00:00:00:01:0b: "
        "fix hosts.mac of h2, then `hysync deploy`")

    with Switch(star.grpc_addr, election_id=(0, 10)) as sw:
        sw.write([delete(forwarding.l2_entry("02:00:00:00:01:02", 2))])
    subprocess.run([*star.exec_in(star.hosts[2]), "ip", "link", "set", star.host_ifs[2], "down"],
                   check=True)
    code, lines = check_on(star, 0, "--from", "h1", str(inventory))
    assert code == 1, lines
    assert lines["port map h2"].startswith(
        "FAIL  port map h2: no l2 entry for 02:00:00:00:01:02; run `hysync deploy` to fix; "
    ), lines
    assert "answered ARP and a ping from h1 (by flooding)" in lines["port map h2"], lines
    assert lines["port map h3"] == (
        "FAIL  port map h3: 02:00:00:00:01:03 -> port 3, flooded; no answer to ARP or a ping "
        "from h1: h3 is down, or its cable is not on port 3 (hosts.switch_port)")
    assert lines["probe"].startswith("ok    probe: from h1") and "1 of 2" in lines["probe"]
