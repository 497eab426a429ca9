"""Every bad input a user may give a front door (`hysync`, the demo, the softswitch) is one
line on stderr and exit status 2, before anything is started or sent: nested files, endless
files, numbers out of range, a bad --serve address. The switch address given is a closed
port, so that a command which got as far as connecting would fail differently (exit 1)."""

from __future__ import annotations

import io
import os
import subprocess
import sys
from collections.abc import Callable
from pathlib import Path

import pytest

from hysync.controlplane.cli.main import main as hysync_main
from hysync.softswitch.__main__ import main as softswitch_main
from hysync.topologies.demo import main as demo_main
from hysync.topologies.run import main as run_main

ROOT = Path(__file__).resolve().parents[1]
DEMO_SCENARIO = ROOT / "topologies" / "scenarios" / "demo.toml"
NOWHERE = "127.0.0.1:1"  # nothing listens: a command that connects fails with exit 1


def hysync(*argv: str) -> tuple[int, str, str]:
    out, err = io.StringIO(), io.StringIO()
    code = hysync_main(["--grpc-addr", NOWHERE, "--timeout", "2", *argv], stdout=out,
                       stderr=err)
    return code, out.getvalue(), err.getvalue()


def refused(result: tuple[int, str, str], *fragments: str) -> str:
    """The one line of a refusal with exit status 2."""
    code, out, err = result
    lines = err.splitlines()
    assert code == 2 and len(lines) == 1 and out == "", (code, out, err[-3000:])
    for fragment in fragments:
        assert fragment in lines[0], lines[0]
    return lines[0]


@pytest.fixture
def nested_toml(tmp_path: Path) -> Path:
    """The issue's file: an array nested 50,000 deep."""
    path = tmp_path / "n.toml"
    path.write_text("x = " + "[" * 50_000 + "]" * 50_000 + "\n")
    return path


@pytest.fixture
def nested_p4info(tmp_path: Path) -> Path:
    """A P4Info whose first table nests 5,000 messages deep."""
    path = tmp_path / "n.p4info.txtpb"
    path.write_text("tables { preamble " + "{ " * 5_000 + "}" * 5_000 + " }\n")
    return path


# ------------------------------------------------------------------ nested files
@pytest.mark.parametrize("argv", [
    ("job", "add", "{file}"),
    ("--serve", "127.0.0.1:1", "job", "add", "{file}"),  # read before the serve is asked
    ("deploy", "--dry-run", "{file}"),
    ("deploy", "--check", "{file}"),
    ("teardown", "{file}"),
    ("serve", "{file}"),
])
def test_a_toml_nested_50000_deep_is_one_line(nested_toml: Path, argv: tuple[str, ...]) -> None:
    refused(hysync(*(a.format(file=nested_toml) for a in argv)), str(nested_toml),
            "nests more than 64 levels deep")


@pytest.mark.parametrize("main", [demo_main, run_main])
def test_a_scenario_nested_50000_deep_is_one_line(nested_toml: Path, main: Callable,
                                                  capsys: pytest.CaptureFixture[str]) -> None:
    argv = [str(nested_toml)] if main is run_main else ["--scenario", str(nested_toml)]
    assert main(argv) == 2
    refused((2, "", capsys.readouterr().err), str(nested_toml), "nests more than 64")


def test_a_p4info_nested_5000_deep_is_one_line(nested_p4info: Path,
                                               capsys: pytest.CaptureFixture[str]) -> None:
    refused(hysync("pipeline", "push", "--p4info", str(nested_p4info)), str(nested_p4info),
            "nests more than 64 levels deep")
    with pytest.raises(SystemExit) as exit_:
        softswitch_main(["--grpc-addr", "127.0.0.1:0", "--udp", "127.0.0.1:0",
                         "--p4info", str(nested_p4info)])
    assert exit_.value.code == 2
    refused((2, "", capsys.readouterr().err), str(nested_p4info), "nests more than 64")


def test_dotted_keys_nested_deep_are_one_line(tmp_path: Path) -> None:
    """a.a.a... = 1 nests tables without a bracket (and tomllib takes time quadratic in
    its parts): refused before parsing."""
    path = tmp_path / "dotted.toml"
    path.write_text("a" + ".a" * 500_000 + " = 1\n")
    # the pre-parse check names the dotted key: tomllib never saw it
    refused(hysync("job", "add", str(path)), str(path), "(line 1, a dotted key)")


# ------------------------------------------------------------------ endless files
def test_job_add_dev_zero_reads_a_bounded_prefix() -> None:
    # refused for its size: only the 4 MiB prefix was read (an endless read never returns)
    refused(hysync("job", "add", "/dev/zero"), "/dev/zero is larger than 4 MiB")


def test_a_fifo_that_never_ends_is_refused(tmp_path: Path) -> None:
    fifo = tmp_path / "endless.toml"
    os.mkfifo(fifo)
    # Held open read-write here, the FIFO has a writer before the loader opens it; `yes`
    # then writes into it without end.
    held = os.open(fifo, os.O_RDWR)
    writer = subprocess.Popen(["sh", "-c", f"exec yes 'x = 1' > {fifo}"])
    try:
        refused(hysync("job", "add", str(fifo)), "endless.toml is larger than 4 MiB")
    finally:
        writer.kill()
        writer.wait()
        os.close(held)


def test_a_fifo_without_a_writer_does_not_hang(tmp_path: Path) -> None:
    fifo = tmp_path / "nobody.toml"
    os.mkfifo(fifo)
    refused(hysync("job", "add", str(fifo)), "nobody.toml")  # empty: no job_id


def test_a_huge_p4info_is_refused(tmp_path: Path) -> None:
    path = tmp_path / "huge.txtpb"
    with path.open("wb") as f:
        f.truncate(17 << 20)  # sparse: 17 MiB of zero bytes, over the 16 MiB limit
    refused(hysync("pipeline", "push", "--p4info", str(path)), "huge.txtpb is larger than 16")


# ------------------------------------------------------------------ numbers
@pytest.mark.parametrize("value", ["-1", "1180591620717411303424", "18446744073709551616",
                                   "1e3", "x"])
def test_device_id_out_of_range_is_one_line(value: str) -> None:
    refused(hysync(f"--device-id={value}", "job", "list"), "device id", "uint64")


@pytest.mark.parametrize("value", ["-1", "18446744073709551616", "1,18446744073709551616", "x"])
def test_election_id_out_of_range_is_one_line(value: str) -> None:
    refused(hysync(f"--election-id={value}", "job", "list"), "election id")


@pytest.mark.parametrize("option", ["--timeout", "--wait"])
@pytest.mark.parametrize("value", ["inf", "nan", "1e300", "0", "-5"])
def test_seconds_out_of_range_are_one_line(option: str, value: str) -> None:
    refused(hysync("mode", "set", "1", "--slots", "0-7", "sync", f"{option}={value}"),
            "seconds > 0 and at most")


@pytest.mark.parametrize("args, fragment", [
    (("--quorum", "1180591620717411303424"), "quorum"),
    (("--quorum", "0"), "quorum"),
    (("--slots", "0-99999999999999999999"), "slots are 0-"),
])
def test_mode_set_numbers_out_of_range_are_one_line(args: tuple[str, ...],
                                                    fragment: str) -> None:
    argv = ["mode", "set", "1", "partial", *args]
    if "--slots" not in args:
        argv += ["--slots", "0-7"]
    refused(hysync(*argv), fragment)


def test_softswitch_device_id_out_of_range(capsys: pytest.CaptureFixture[str]) -> None:
    with pytest.raises(SystemExit) as exit_:
        softswitch_main(["--device-id", "18446744073709551616"])
    assert exit_.value.code == 2
    refused((2, "", capsys.readouterr().err), "device id")


# ------------------------------------------------------------------ --serve
@pytest.mark.parametrize("address", ["nonsense", "unix:", "host:99999", "127.0.0.1:0", ":9600"])
def test_a_bad_serve_address_is_one_line(address: str) -> None:
    refused(hysync("--serve", address, "mode", "set", "7", "--slots", "0-255", "sync"),
            "--serve", repr(address))


def test_a_bad_serve_address_from_the_environment(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("HYSYNC_SERVE", "nonsense")
    refused(hysync("mode", "set", "7", "--slots", "0-255", "sync"), "$HYSYNC_SERVE")


def test_the_console_script_prints_no_traceback() -> None:
    """The issue's command, as a user runs it: a real process, its real stderr."""
    run = subprocess.run([sys.executable, "-m", "hysync.controlplane.cli", "--serve",
                          "nonsense", "mode", "set", "7", "--slots", "0-255", "sync"],
                         capture_output=True, text=True, timeout=120, cwd=ROOT)
    refused((run.returncode, run.stdout, run.stderr), "hysync: error:", "'nonsense'")


# ------------------------------------------------------------------ scenarios
@pytest.mark.parametrize("line, field", [
    ("factor = 1180591620717411303424", "factor"),  # 2**70
    ("factor = inf", "factor"),
    ("factor = nan", "factor"),
    ("compute_ms = 1180591620717411303424", "compute_ms"),
    ("until_s = 1e300", "until_s"),
])
def test_scenario_numbers_a_run_cannot_use_are_refused(tmp_path: Path, line: str, field: str,
                                                       capsys: pytest.CaptureFixture[str]
                                                       ) -> None:
    text = DEMO_SCENARIO.read_text()
    key = line.split(" = ")[0]
    if key == "compute_ms":
        text = f"{line}\n" + "\n".join(t for t in text.splitlines()
                                       if not t.startswith("compute_ms"))
    else:
        text += f'\n[[straggler]]\nworker = 2\npattern = "recovering"\n{line}\n'
    path = tmp_path / "s.toml"
    path.write_text(text)
    out = tmp_path / "out"
    assert demo_main(["--scenario", str(path), "--out", str(out)]) == 2
    refused((2, "", capsys.readouterr().err), str(path), f"'{field}'")
    assert not out.exists()  # refused before anything started


def test_a_scenario_the_demo_cannot_emulate_starts_nothing(
        tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    path = tmp_path / "linked.toml"
    path.write_text(DEMO_SCENARIO.read_text() + "\n[link]\nbandwidth_mbit = 10.0\n")
    out = tmp_path / "out"
    assert demo_main(["--scenario", str(path), "--out", str(out)]) == 2
    refused((2, "", capsys.readouterr().err), str(path), "[link] needs Mininet", "make emulate")
    assert not out.exists()


def test_an_unwritable_out_directory_starts_nothing(tmp_path: Path,
                                                    capsys: pytest.CaptureFixture[str]) -> None:
    blocker = tmp_path / "file"
    blocker.write_text("")
    assert demo_main(["--out", str(blocker / "out")]) == 2
    refused((2, "", capsys.readouterr().err), "--out", "cannot create it")
