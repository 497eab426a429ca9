"""`hysync` end to end: each call a fresh process state (main() or a real subprocess)
against a real softswitch; every failure is exit != 0 and one line on stderr."""

from __future__ import annotations

import io
import json
import shutil
import socket
import subprocess
import sys
import time
from collections.abc import Callable
from pathlib import Path

import pytest

from hysync import p4names, wire
from hysync.controlplane.cli.main import main
from hysync.controlplane.p4rt.switch import Switch

from .conftest import EXAMPLE_JOB, P4INFO, ROOT, Softswitch, free_udp_socket
from .senders import Shared
from .test_controller import SwitchCalls
from .test_dataplane import finish, start, wait_progress

Run = Callable[..., tuple[int, str, str]]


@pytest.fixture
def hysync(softswitch: Softswitch) -> Run:
    """hysync --grpc-addr <the softswitch> ARGS... -> (exit status, stdout, stderr)."""
    def run(*args: str, addr: str | None = None) -> tuple[int, str, str]:
        out, err = io.StringIO(), io.StringIO()
        code = main(["--grpc-addr", addr or softswitch.grpc_addr, *args], stdout=out,
                    stderr=err)
        return code, out.getvalue(), err.getvalue()
    return run


@pytest.fixture
def pushed(hysync: Run) -> Run:
    code, out, err = hysync("pipeline", "push", "--p4info", str(P4INFO))
    assert (code, err) == (0, ""), err
    assert "6 tables, 8 counters" in out
    return hysync


def one_line_error(result: tuple[int, str, str], *fragments: str) -> str:
    code, out, err = result
    assert code != 0 and out == ""
    lines = err.splitlines()
    assert len(lines) == 1 and lines[0].startswith("hysync: error: "), err
    for fragment in fragments:
        assert fragment in lines[0], lines[0]
    return lines[0]


def job_file(tmp_path: Path, ports: list[int], count: int = 16) -> Path:
    members = "\n".join(
        f'[[members]]\nworker = {w}\nipv4 = "127.0.0.1"\nmac = "02:00:00:00:00:0{w + 1}"\n'
        f"udp_port = {p}\nswitch_port = 1\n" for w, p in enumerate(ports))
    path = tmp_path / "job.toml"
    path.write_text(f'job_id = 1\nmode = "sync"\n[slots]\nbase = 0\ncount = {count}\n{members}')
    return path


def test_a_job_lifecycle_from_the_command_line(pushed: Run) -> None:
    code, out, _ = pushed("job", "add", str(EXAMPLE_JOB))
    assert code == 0 and out.startswith("job 1 installed (16 updates): 4 members, slots 0-255")
    code, out, _ = pushed("job", "add", str(EXAMPLE_JOB))
    assert code == 0 and "job 1 unchanged" in out
    code, out, _ = pushed("job", "list")
    assert out.strip() == "job 1: slots 0-255, 4/4 members active; modes: 0-255 sync"

    code, out, _ = pushed("mode", "set", "1", "--slots", "0-63", "partial", "--quorum", "3")
    assert code == 0 and out.strip() == "job 1 slots 0-63: partial(3) (new range entry)"
    code, out, _ = pushed("mode", "show", "1")
    assert "slots 0-63: partial(3)" in out and "slots 64-255: sync" in out

    code, out, _ = pushed("member", "exclude", "1", "3")
    assert out.strip() == "job 1: worker 3 excluded; 3 active members"
    code, out, _ = pushed("--json", "job", "list")
    listed = json.loads(out)["jobs"][0]
    assert listed["members"] == 3 and [w["active"] for w in listed["workers"]] == [
        True, True, True, False]
    assert listed["modes"] == [{"slots": [0, 63], "mode": "partial", "quorum": 3},
                               {"slots": [64, 255], "mode": "sync", "quorum": 0}]
    code, out, _ = pushed("member", "readmit", "1", "3")
    assert out.strip() == "job 1: worker 3 readmitted; 4 active members"

    code, out, _ = pushed("stats", "1")
    assert code == 0 and "drops: none" in out and len(out.splitlines()) == 7
    code, out, _ = pushed("job", "remove", "1")
    assert (code, out.strip()) == (0, "job 1 removed (17 updates)")  # 2 modes entries
    assert pushed("job", "list")[1].strip() == "no jobs installed"


def test_global_options_may_follow_the_command(pushed: Run, softswitch: Softswitch) -> None:
    out = io.StringIO()
    code = main(["job", "list", "--json", "--grpc-addr", softswitch.grpc_addr], stdout=out)
    assert code == 0 and json.loads(out.getvalue()) == {"jobs": [], "problems": []}


def test_mode_set_waits_until_the_range_has_latched(pushed: Run, softswitch: Softswitch,
                                                    tmp_path: Path) -> None:
    socks = [free_udp_socket() for _ in range(4)]
    try:
        path = job_file(tmp_path, [s.getsockname()[1] for s in socks])
        assert pushed("job", "add", str(path))[0] == 0
        shared = Shared()
        senders = start(softswitch, socks, [0, 1, 2, 3], shared)
        try:
            wait_progress(senders, 3)
            code, out, err = pushed("--json", "mode", "set", "1", "--slots", "0-15", "partial",
                                    "--quorum", "3", "--wait", "30")
            assert (code, err) == (0, "")
            report = json.loads(out)
            assert report["strategy"] == "modify" and report["latched_after"] > 0
            code, out, _ = pushed("mode", "set", "1", "--slots", "0-15", "sync", "--wait", "30")
            assert code == 0 and "; latched after " in out
            code, out, _ = pushed("--json", "stats", "1", "--watch", "0.2", "--count", "2")
            frames = [json.loads(line) for line in out.splitlines()]
            assert len(frames) == 2
            assert all(w["contributions"] > 0 for w in frames[1]["rates"]["workers"])
            finish(senders, shared)
        finally:
            shared.stop.set()
    finally:
        for s in socks:
            s.close()


def test_waiting_for_a_latch_without_traffic_says_the_write_landed(pushed: Run) -> None:
    pushed("job", "add", str(EXAMPLE_JOB))
    code, out, err = pushed("mode", "set", "1", "--slots", "0-255", "async", "--wait", "0.3")
    # exit 3, not 1: the mode is written (the report says so), only the latch is not seen
    assert code == 3
    assert out == "job 1 slots 0-255: async (one MODIFY); written, not latched within 0.3 s\n"
    lines = err.splitlines()
    assert len(lines) == 1 and lines[0].startswith("hysync: error: the mode is written"), err
    assert "have not all latched async after 0.3 s" in lines[0]
    assert "slots 0-255: async" in pushed("mode", "show", "1")[1]
    code, out, _ = pushed("--json", "mode", "set", "1", "--slots", "0-255", "async",
                          "--wait", "0.2")
    assert code == 3 and json.loads(out)["latched"] is False


# ------------------------------------------------------------------ error paths
def test_an_unreachable_switch(hysync: Run) -> None:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        addr = f"127.0.0.1:{s.getsockname()[1]}"
    one_line_error(hysync("job", "list", addr=addr), f"cannot reach the switch at {addr}",
                   "python -m hysync.softswitch --grpc-addr")


def test_not_the_primary(pushed: Run, softswitch: Softswitch) -> None:
    with Switch(softswitch.grpc_addr, election_id=(0, 5)):
        line = one_line_error(pushed("job", "add", str(EXAMPLE_JOB)),
                              "not the primary controller", "election id 5 is primary",
                              "--election-id", "hysync --serve ADDR")
        assert "1 is not higher" in line
        # Reading never needs to be primary.
        assert pushed("job", "list")[0] == 0
        assert pushed("--election-id", "0,6", "job", "add", str(EXAMPLE_JOB))[0] == 0


def test_a_wrong_device_id(pushed: Run) -> None:
    one_line_error(pushed("--device-id", "2", "job", "add", str(EXAMPLE_JOB)),
                   "unknown device id 2")


def test_no_pipeline_yet(hysync: Run) -> None:
    one_line_error(hysync("job", "add", str(EXAMPLE_JOB)), "has no pipeline",
                   "hysync pipeline push --p4info")


@pytest.mark.parametrize("args", [("job", "remove", "9"), ("mode", "show", "9"),
                                  ("stats", "9"), ("member", "exclude", "9", "0"),
                                  ("mode", "set", "9", "--slots", "0-1", "sync")])
def test_an_unknown_job(pushed: Run, args: tuple[str, ...]) -> None:
    pushed("job", "add", str(EXAMPLE_JOB))
    one_line_error(pushed(*args), "no job 9 on the switch", "installed jobs: 1")


@pytest.mark.parametrize(("slots", "fragment"), [
    ("5-x", "bad slot range '5-x': write it as A-B"), ("", "bad slot range"),
    ("9-3", "the first slot is above the last; write 3-9"),
    ("0-300", "slots 0-300 are outside job 1's slots 0-255"),
])
def test_a_bad_slot_range(pushed: Run, slots: str, fragment: str) -> None:
    pushed("job", "add", str(EXAMPLE_JOB))
    one_line_error(pushed("mode", "set", "1", "--slots", slots, "sync"), fragment)


@pytest.mark.parametrize(("args", "fragment"), [
    (("partial", "--quorum", "9"), "quorum between 1 and 4"),
    (("partial",), "partial needs --quorum Q"),
    (("sync", "--quorum", "2"), "--quorum is for partial only"),
    (("eager",), "invalid choice: 'eager'"),
])
def test_a_bad_mode_or_quorum(pushed: Run, args: tuple[str, ...], fragment: str) -> None:
    pushed("job", "add", str(EXAMPLE_JOB))
    one_line_error(pushed("mode", "set", "1", "--slots", "0-7", *args), fragment)


def test_mode_set_with_wait_reads_the_switch_once(pushed: Run,
                                                 monkeypatch: pytest.MonkeyPatch) -> None:
    """One full read and one write of the setting, --wait included (no traffic here: the
    range does not latch, exit 3); the latch is judged from the counters alone."""
    pushed("job", "add", str(EXAMPLE_JOB))
    calls = SwitchCalls(monkeypatch)
    code, out, err = pushed("mode", "set", "1", "--slots", "0-7", "partial", "--quorum", "3",
                            "--wait", "0.2")
    assert code == 3 and "job 1 slots 0-7: partial(3) (new range entry)" in out + err, err
    assert calls.reads == 1 and len(calls.mode_writes) == 1


def test_a_bad_job_file(pushed: Run, tmp_path: Path) -> None:
    one_line_error(pushed("job", "add", str(tmp_path / "none.toml")),
                   "cannot read the job file", "controlplane/examples/job-loopback.toml")
    bad = tmp_path / "bad.toml"
    bad.write_text(EXAMPLE_JOB.read_text().replace("switch_port = 1", "switch_port = 600", 1))
    one_line_error(pushed("job", "add", str(bad)), "bad.toml: members[0].switch_port = 600 is "
                   "out of range: use 0..510")


def test_binary_files_are_one_line_exit_2_and_write_nothing(pushed: Run,
                                                             tmp_path: Path) -> None:
    binary = tmp_path / "binary.bin"
    binary.write_bytes(b"\x80\xff job_id = 1\n")
    assert one_line_error(pushed("job", "add", str(binary)), "binary.bin is not UTF-8 text")
    assert pushed("job", "add", str(binary))[0] == 2
    one_line_error(pushed("pipeline", "push", "--p4info", str(binary)),
                   "binary.bin is not UTF-8 text")
    assert pushed("pipeline", "push", "--p4info", str(binary))[0] == 2
    assert json.loads(pushed("--json", "job", "list")[1]) == {"jobs": [], "problems": []}


def test_a_bad_p4info_path(hysync: Run, tmp_path: Path) -> None:
    one_line_error(hysync("pipeline", "push", "--p4info", str(tmp_path / "x.txtpb")),
                   "cannot read the P4Info file", "p4src/v1model/hysync.p4info.txtpb")
    one_line_error(hysync("pipeline", "push"), "pipeline push needs --p4info FILE")


@pytest.mark.parametrize("args", [("--election-id", "x", "job", "list"),
                                  ("job", "remove", "0"), ("member", "exclude", "1", "32"),
                                  ("stats",), ("bogus",)])
def test_a_bad_command_line_is_one_line_and_exit_2(hysync: Run, args: tuple[str, ...]) -> None:
    assert hysync(*args)[0] == 2
    one_line_error(hysync(*args))


def test_help_comes_from_the_docstrings(capsys: pytest.CaptureFixture[str]) -> None:
    assert main(["mode", "set", "--help"]) == 0
    assert "Hot-swap the desired mode of a slot range" in capsys.readouterr().out
    assert main(["--help"]) == 0
    assert "Install the job described by a TOML job file" not in capsys.readouterr().out


# ------------------------------------------------------------------ real processes
def _console_script() -> str:
    script = ROOT / ".venv" / "bin" / "hysync"
    found = str(script) if script.exists() else shutil.which("hysync")
    if found is None:
        pytest.skip("the hysync console script is not installed (run `make setup`)")
    return found


def test_the_installed_console_script(pushed: Run, softswitch: Softswitch) -> None:
    pushed("job", "add", str(EXAMPLE_JOB))
    run = subprocess.run([_console_script(), "--grpc-addr", softswitch.grpc_addr, "--json",
                          "job", "list"], capture_output=True, text=True, timeout=60)
    assert run.returncode == 0, run.stderr
    assert [j["job_id"] for j in json.loads(run.stdout)["jobs"]] == [1]
    run = subprocess.run([_console_script(), "--grpc-addr", softswitch.grpc_addr, "job",
                          "remove", "7"], capture_output=True, text=True, timeout=60)
    assert run.returncode == 1 and run.stdout == ""
    assert run.stderr.splitlines() == [run.stderr.strip()]
    assert run.stderr.startswith("hysync: error: no job 7 on the switch")


P4RUNTIME_SHELL_READ = """
import json, sys
import p4runtime_sh.shell as sh
sh.setup(device_id=1, grpc_addr=sys.argv[1], election_id=(0, 2), config=None, verbose=False)
try:
    rows = []
    for te in sh.TableEntry(sys.argv[2]).read():
        value = {f: int.from_bytes(te.match[f].exact.value, "big")
                 for f in ("job_id", "worker_id", "src_addr", "src_port")}
        rows.append(dict(value, action=te.action.action_name))
    groups = [[(r.egress_port, r.instance) for r in g.msg().multicast_group_entry.replicas]
              for g in sh.MulticastGroupEntry(1).read()]
finally:
    sh.teardown()  # its stream thread is not a daemon: without this the process hangs
print(json.dumps({"members": rows, "groups": groups}))
"""


def test_p4runtime_shell_reads_what_the_controller_installed(pushed: Run,
                                                             softswitch: Softswitch) -> None:
    pushed("job", "add", str(EXAMPLE_JOB))
    run = subprocess.run([sys.executable, "-c", P4RUNTIME_SHELL_READ, softswitch.grpc_addr,
                          p4names.ADMISSION_MEMBERS],
                         capture_output=True, text=True, timeout=60, cwd=ROOT)
    assert run.returncode == 0, run.stderr
    seen = json.loads(run.stdout)
    assert sorted((r["job_id"], r["worker_id"], r["src_addr"], r["src_port"], r["action"])
                  for r in seen["members"]) == [
        (1, w, 0x7F000001, 47001 + w, p4names.ADMISSION_ADMIT) for w in range(4)]
    assert sorted(map(tuple, seen["groups"][0])) == [(1, 33 + w) for w in range(4)]


def test_stats_switch_shows_every_drop_whatever_job_its_bytes_name(
        pushed: Run, softswitch: Softswitch) -> None:
    """Datagrams naming jobs 0, 77 and 999 are not in `stats JOB` of
    any installed job, but `stats --switch` counts them all, by reason."""
    sock = free_udp_socket()
    try:
        for job_id, version in ((0, 1), (77, 1), (999, 9)):
            header = wire.Header(op=wire.Op.CONTRIB, job_id=job_id, worker_id=3, slot=1, round=0,
                                 version=version).pack()
            sock.sendto(header + bytes(4 * wire.LANES), softswitch.udp_addr)
        sock.sendto(b"\x01\x02", softswitch.udp_addr)  # shorter than a header
        deadline = time.monotonic() + 5.0
        while True:
            code, out, err = pushed("--json", "stats", "--switch")
            assert code == 0, err
            data = json.loads(out)
            if data["total"] == 4 or time.monotonic() > deadline:
                break
            time.sleep(0.05)
    finally:
        sock.close()
    assert data["drops"]["NOT_MEMBER"] == 2 and data["drops"]["BAD_VERSION"] == 1
    assert data["drops"]["MALFORMED"] == 1 and data["total"] == 4
    code, out, _ = pushed("stats", "--switch")
    assert code == 0 and out.startswith("switch drops: MALFORMED 1, BAD_VERSION 1")
    one_line_error(pushed("stats", "1", "--switch"), "stats needs JOB or --switch")


def test_a_swap_into_async_on_a_tofino_is_one_line_and_changes_nothing(hysync: Run) -> None:
    """docs/tofino.md, difference 3: the TNA program's P4Info on the switch, a sync job."""
    tna = ROOT / "p4src" / "tna" / "hysync.tofino.p4info.txtpb"
    assert hysync("pipeline", "push", "--p4info", str(tna))[0] == 0
    assert hysync("job", "add", str(EXAMPLE_JOB))[0] == 0
    before = hysync("job", "list", "--json")
    assert before[0] == 0 and '"sync"' in before[1], before
    one_line_error(hysync("mode", "set", "1", "--slots", "0-7", "async"),
                   "cannot hot-swap a slot into async", "Tofino program (tna)")
    assert hysync("job", "list", "--json") == before
    code, _, err = hysync("mode", "set", "1", "--slots", "0-7", "partial", "--quorum", "3")
    assert (code, err) == (0, "")
