"""What the package says about itself and the files it ships: `hysync.__version__` and
`hysync --version` from the installed metadata, and `hysync:RELATIVE` names for the P4Info
and examples wherever HySync is installed (a bad name is one line naming the fix)."""

from __future__ import annotations

import io
from importlib.metadata import version

import pytest

import hysync
from hysync import resources
from hysync.controlplane.cli.main import main
from hysync.p4schema import Schema

from .controlplane.conftest import P4INFO


def test_the_version_is_the_installed_distributions(capsys: pytest.CaptureFixture[str]) -> None:
    assert hysync.__version__ == version("hysync")
    assert main(["--version"]) == 0
    assert capsys.readouterr().out.strip() == f"hysync {hysync.__version__}"


def test_shipped_files_are_found_by_their_package_names() -> None:
    assert resources.path(resources.V1MODEL_P4INFO).read_text() == P4INFO.read_text()
    for name in ("examples/train_ddp.py", "examples/loopback.toml", "examples/rack.toml",
                 "p4src/tna/hysync.tofino2.p4info.txtpb", "p4src/v1model/hysync.p4"):
        assert resources.path(name).is_file(), name
    schema = Schema.from_file("hysync:" + resources.V1MODEL_P4INFO)
    assert schema.tables == Schema.from_file(P4INFO).tables


def test_an_unshipped_name_is_one_line_naming_what_ships() -> None:
    err = io.StringIO()
    code = main(["pipeline", "push", "--p4info", "hysync:p4src/nope.txtpb"], stderr=err)
    assert code == 2
    line = err.getvalue().strip()
    assert len(line.splitlines()) == 1
    assert line.startswith("hysync: error: hysync:p4src/nope.txtpb: HySync ships no such file")
    assert "under p4src/ and examples/" in line
