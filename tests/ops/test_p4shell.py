"""p4runtime-shell against the softswitch: it reads the modes table as a backup (below
the primary's election id, which stays primary and keeps writing), the P4Info it gets
names the modes, and hysync.p4shell prints them by name."""

from __future__ import annotations

import pytest
from google.protobuf import text_format
from p4.config.v1 import p4info_pb2
from p4runtime_sh import shell

from hysync.controlplane.controller import Controller
from hysync.controlplane.p4rt.switch import Switch
from hysync.p4shell import enum_names, show_modes
from hysync.softswitch.p4binding import ConfigError, bind_p4info
from hysync.softswitch.pipeline import Pipeline
from hysync.wire import Mode
from tests.controlplane.conftest import P4INFO, Softswitch, make_job


def test_p4runtime_shell_reads_the_modes_by_name_without_disturbing_the_primary(
        softswitch: Softswitch, capsys) -> None:  # type: ignore[no-untyped-def]
    with Switch(softswitch.grpc_addr, election_id=(0, 10)) as primary:
        primary.push_pipeline(P4INFO)
        controller = Controller(primary).attach()
        controller.add_job(make_job(3, workers=4, base=0, count=64))
        controller.set_mode(3, slots=(16, 31), mode=Mode.PARTIAL, quorum=2)
        controller.set_mode(3, slots=(32, 63), mode=Mode.ASYNC)
        shell.setup(device_id=1, grpc_addr=softswitch.grpc_addr, election_id=(0, 1),
                    verbose=False)
        try:
            p4info = shell.context.p4info
            assert enum_names(p4info) == {0: "SYNC", 1: "PARTIAL", 2: "ASYNC"}
            lines = show_modes()
        finally:
            shell.teardown()
        assert "You are not the primary client" in capsys.readouterr().out  # a backup
        assert sorted(line.split(": ", 1)[1] for line in lines) == [
            "ASYNC", "PARTIAL quorum 2", "SYNC"]
        assert any(line.startswith("job 3 slots 16-31 ") and "PARTIAL quorum 2" in line
                   for line in lines)
        # the primary was never displaced: it still writes
        assert primary.is_primary
        controller.set_mode(3, slots=(16, 31), mode=Mode.SYNC)
    # and the switch's election floor is still the primary's: 10 becomes primary again
    with Switch(softswitch.grpc_addr, election_id=(0, 10)) as again:
        assert again.is_primary


def test_the_softswitch_refuses_a_p4info_that_names_the_modes_otherwise() -> None:
    p4info = p4info_pb2.P4Info()
    text_format.Parse(P4INFO.read_text(), p4info)
    bind_p4info(p4info, Pipeline())  # the committed one, enum included
    members = p4info.type_info.serializable_enums["sync_mode_t"].members
    members[1].value, members[2].value = b"\x02", b"\x01"  # PARTIAL and ASYNC swapped
    with pytest.raises(ConfigError, match="serializable enum sync_mode_t is .*'PARTIAL': 2"):
        bind_p4info(p4info, Pipeline())
