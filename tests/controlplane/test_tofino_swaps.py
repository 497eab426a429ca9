"""What a hot swap may do on the Tofino program (docs/tofino.md, difference 3): a slot never
enters or leaves async by a hot swap there. The controller reads the architecture from the
P4Info the switch runs; the softswitch serves the TNA P4Info over real P4Runtime (its
table and action names are the v1model program's), so the controller meets the Tofino
pipeline's P4Info as it would on a Stratum switch."""

from __future__ import annotations

from collections.abc import Iterator

import pytest

from hysync import p4names
from hysync.controlplane.controller import Controller
from hysync.controlplane.errors import ValidationError
from hysync.controlplane.p4rt.switch import Switch
from hysync.controlplane.policy.policies import AdaptivePolicy, candidates
from hysync.controlplane.policy.runner import PolicyRunner
from hysync.wire import Mode

from .conftest import ROOT, Softswitch, make_job, read_table, running_softswitch

TNA_P4INFO = {chip: ROOT / "p4src" / "tna" / f"hysync.{chip}.p4info.txtpb"
              for chip in ("tofino", "tofino2")}


@pytest.fixture(params=sorted(TNA_P4INFO))
def tofino(request: pytest.FixtureRequest) -> Iterator[Controller]:
    """A controller on a switch that runs the TNA program's P4Info (Tofino 1 or 2)."""
    softswitch: Softswitch
    for softswitch in running_softswitch():
        with Switch(softswitch.grpc_addr) as sw:
            sw.push_pipeline(TNA_P4INFO[request.param])
            yield Controller(sw).attach()


def modes(controller: Controller) -> list[tuple[tuple[int, int], int, int]]:
    return sorted((e.match["slot"], e.params["mode"], e.params["quorum"])
                  for e in read_table(controller.switch, p4names.SYNC_MODE_MODES))


def test_the_tna_pipeline_is_known_by_its_p4info(tofino: Controller) -> None:
    assert tofino.arch in ("tna", "t2na")
    assert not tofino.hot_swaps_async


@pytest.mark.parametrize(("installed", "to", "slots"), [
    ("sync", Mode.ASYNC, (0, 255)),
    ("partial", Mode.ASYNC, (16, 31)),      # a sub-range enters async
    ("async", Mode.SYNC, (0, 255)),
    ("async", Mode.PARTIAL, (64, 127)),     # a sub-range leaves async
])
def test_a_swap_into_or_out_of_async_is_refused_and_changes_nothing(
        tofino: Controller, installed: str, to: Mode, slots: tuple[int, int]) -> None:
    tofino.add_job(make_job(1, mode=installed, quorum=3 if installed == "partial" else None))
    before = modes(tofino)
    way = "into" if to == Mode.ASYNC else "out of"
    with pytest.raises(ValidationError, match=f"cannot hot-swap a slot {way} async.*difference 3"):
        tofino.set_mode(1, slots=slots, mode=to, quorum=3 if to == Mode.PARTIAL else None)
    assert modes(tofino) == before


def test_sync_and_partial_swap_freely_and_async_stays_async(tofino: Controller) -> None:
    tofino.add_job(make_job(1, mode="sync"))
    assert tofino.set_mode(1, slots=(0, 255), mode=Mode.PARTIAL, quorum=3).strategy == "modify"
    assert tofino.set_mode(1, slots=(0, 31), mode=Mode.SYNC).strategy == "insert"
    assert modes(tofino) == [((0, 31), int(Mode.SYNC), 0), ((0, 255), int(Mode.PARTIAL), 3)]
    tofino.add_job(make_job(2, mode="async", base=256, count=64))
    # Setting async on slots that are async changes no slot: allowed, and writes nothing.
    assert tofino.set_mode(2, slots=(256, 319), mode=Mode.ASYNC).strategy == "unchanged"


def test_the_policy_adapts_without_async_on_tofino(tofino: Controller) -> None:
    tofino.add_job(make_job(1, mode="sync"))
    policy = AdaptivePolicy()
    assert policy.config.allow_async
    with PolicyRunner(tofino, 1, policy):
        pass
    assert not policy.config.allow_async
    assert all(mode != Mode.ASYNC for mode, _ in candidates(4, 3, policy.config))


def test_v1model_keeps_every_hot_swap(controller: Controller) -> None:
    assert controller.arch == "v1model" and controller.hot_swaps_async
    controller.add_job(make_job(1, mode="async"))
    assert controller.set_mode(1, slots=(0, 255), mode=Mode.SYNC).strategy == "modify"
