"""`python -m hysync.codegen [--check]`: every generated file, one command.

The committed generated files (the P4 sources, hysync/p4names.py, docs/protocol.md's
decision table) are what the generators write now; a hand edit, or a source changed
without a run, is found by name, in a copy of the tree, and a run puts it right.
"""

from __future__ import annotations

import shutil
import subprocess
import sys
from pathlib import Path

import pytest

from hysync import codegen, gen_wire_header
from hysync.protocol_spec import render


def run(*args: str) -> subprocess.CompletedProcess[str]:
    return subprocess.run([sys.executable, "-m", "hysync.codegen", *args],
                          capture_output=True, text=True, timeout=300)


def copy_tree(root: Path) -> None:
    """What the generators read and write, copied from this repository under `root`."""
    for path in [gen.path for gen in codegen.generated()] + [codegen.P4INFO]:
        (root / path).parent.mkdir(parents=True, exist_ok=True)
        shutil.copy(codegen.ROOT / path, root / path)


def test_the_committed_generated_files_are_up_to_date() -> None:
    done = run("--check")
    assert done.returncode == 0, done.stderr
    assert done.stderr == ""


def test_an_edited_generated_file_fails_the_check_and_a_run_restores_it(tmp_path: Path) -> None:
    copy_tree(tmp_path)
    assert run("--check", "--root", str(tmp_path)).returncode == 0
    decide = tmp_path / "p4src/v1model/include/control/decide.p4"
    decide.write_text(decide.read_text().replace("emit_t.CLOSE_AS_IS", "emit_t.NONE"))
    (tmp_path / "p4src/shared/wire.p4").unlink()
    names = tmp_path / "hysync/p4names.py"
    names.write_text(names.read_text().replace("_SIZE: Final = 256", "_SIZE: Final = 255", 1))
    protocol = tmp_path / codegen.PROTOCOL
    text = protocol.read_text()
    protocol.write_text(text.replace("a JOIN never makes a round of its own |", "edited |", 1))

    done = run("--check", "--root", str(tmp_path))
    assert done.returncode == 1
    lines = done.stderr.strip().splitlines()
    assert len(lines) == 1, done.stderr
    for path in ("p4src/shared/wire.p4", "p4src/v1model/include/control/decide.p4",
                 "hysync/p4names.py", codegen.PROTOCOL):
        assert path in lines[0]
    assert "p4src/shared/decision.p4" not in lines[0]
    assert "run `python -m hysync.codegen`" in lines[0]

    done = run("--root", str(tmp_path))
    assert done.returncode == 0, done.stderr
    assert done.stdout.count("wrote ") == 4
    assert run("--check", "--root", str(tmp_path)).returncode == 0
    assert protocol.read_text() == text  # only the table is generated; the prose is kept
    for path in ("p4src/shared/wire.p4", "hysync/p4names.py"):
        assert (tmp_path / path).read_text() == (codegen.ROOT / path).read_text()


def test_a_changed_source_makes_its_files_stale(tmp_path: Path) -> None:
    copy_tree(tmp_path)
    p4info = tmp_path / codegen.P4INFO
    p4info.write_text(p4info.read_text().replace("size: 256", "size: 512", 1))
    assert codegen.stale(tmp_path) == ["hysync/p4names.py"]


def test_a_document_without_its_table_markers_is_refused(tmp_path: Path) -> None:
    copy_tree(tmp_path)
    protocol = tmp_path / codegen.PROTOCOL
    protocol.write_text(protocol.read_text().replace("<!-- END decision table -->", ""))
    done = run("--check", "--root", str(tmp_path))
    assert done.returncode == 1
    assert "docs/protocol.md has no decision table markers" in done.stderr
    assert len(done.stderr.strip().splitlines()) == 1


def test_a_root_that_is_not_the_repository_is_refused(tmp_path: Path) -> None:
    done = run("--check", "--root", str(tmp_path))
    assert done.returncode == 2
    assert "is not a HySync repository" in done.stderr


def test_headers_are_written_once_and_kept_when_unchanged(tmp_path: Path) -> None:
    out = tmp_path / "generated"
    assert run("--headers", str(out)).returncode == 0
    assert (out / "hysync_wire.h").read_text() == gen_wire_header.render()
    assert (out / "hysync_decision.h").read_text() == render.cpp()
    assert codegen.write_headers(out) == []  # unchanged: not rewritten, mtimes kept
    (out / "hysync_wire.h").write_text("stale")
    assert codegen.write_headers(out) == [out / "hysync_wire.h"]


@pytest.mark.parametrize("args", [["--check", "--headers", "x"], ["--bogus"]])
def test_bad_arguments_say_how_to_call_it(args: list[str]) -> None:
    done = run(*args)
    assert done.returncode == 2
    assert "usage: python -m hysync.codegen" in done.stderr
