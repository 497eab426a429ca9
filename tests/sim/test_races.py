"""The checker finds each of the latest races when its rule is taken out.

Each rule closed a race that a timing-dependent test or the simulation found first
(docs/protocol.md §9, "Swap storms" and "A switch that lost the job's state"; §4 step 8):
the transmission-number echo, the JOIN, the install epoch, the install tag, the refusal
mark, the JOIN mark and the chase of displaced chunks; and the overflow sentinel of
non-finite values (docs/protocol.md §9, "Non-finite values"). With the rule taken out (a
fault of the engine, a longer `join_after` than any run, a pipeline that never sees a new
install, never tags its replies or never marks what it refused), some seed of a fixed,
small budget must violate an invariant; with the rule in, the same seeds pass. The marks'
races are rarer (a seed in tens of thousands): their tests replay schedules that meet them
(tests/sim/plans/), as the shrinker left them, or, for join_copied.json, that shrunk schedule
on another draw of a network that duplicates 10% each way: the worker's timers decide which
schedules meet a race, and a change to them calls for a new draw.
"""

from __future__ import annotations

from pathlib import Path

import pytest

from hysync import wire
from hysync.softswitch.pipeline import Pipeline

from .check import check
from .plan import (
    FAULT_KINDS,
    HOST_KINDS,
    HOSTS_DRAWN,
    PROBE_PERIOD_AS_FOUND,
    STRAGGLER,
    Plan,
    draw,
)
from .run import simulate

BUDGET = 40  # seeds tried per race, at most


class NoEpochPipeline(Pipeline):
    """The reference model with the install epoch taken out: every install looks like the
    first, so a re-added job inherits its slots' rounds, results and counted sequences."""

    def _admit(self, payload, src_ip, src_port, nbytes):  # type: ignore[no-untyped-def]
        admitted = super()._admit(payload, src_ip, src_port, nbytes)
        return None if admitted is None else (*admitted[:-1], 1)


class NoTagPipeline(Pipeline):
    """The reference model with the install tag taken out: every RESULT and ACK carries
    tag 0, so a worker learns of a new install from rounds alone."""

    def process_datagram(self, src_ip, src_port, payload):  # type: ignore[no-untyped-def]
        return [(ip, port, _untagged(d)) for ip, port, d in
                super().process_datagram(src_ip, src_port, payload)]


class NoRefusalPipeline(Pipeline):
    """The reference model with the refusal mark taken out: an async slot counts a copy of
    a contribution the switch answered "not counted"."""

    def _refuse(self, seq_index, r, epoch, kept):  # type: ignore[no-untyped-def]
        pass



class NoJoinMarkPipeline(Pipeline):
    """The reference model with the JOIN mark taken out: a copy of a JOIN answered
    NOT_JOINED is counted in the round opened since."""

    def _join_marked(self, seq_index, r, epoch):  # type: ignore[no-untyped-def]
        return False

    def _mark_join(self, seq_index, r, epoch, counted, spent):  # type: ignore[no-untyped-def]
        pass


def _untagged(datagram: bytes) -> bytes:
    if datagram[wire.FIELD_OFFSET["op"]] not in (wire.Op.RESULT, wire.Op.ACK):
        return datagram
    at = wire.FIELD_OFFSET["reason"]
    return datagram[:at] + b"\0" + datagram[at + 1:]


def _first_violation(kinds: tuple[str, ...], start: int, **options: object) -> tuple[int, str]:
    for seed in range(start, start + BUDGET):
        rec, sim = simulate(draw(seed, kinds), "python", **options)
        found = check(rec, sim)
        if found:
            return seed, found[0]
    return -1, ""


def test_without_the_echo_check_a_storm_counts_twice() -> None:
    seed, why = _first_violation(("storm",), 20_000,
                                 faults={"ignore_echo": True})
    assert seed >= 0, f"no violation in {BUDGET} storm seeds without the echo check"
    rec, sim = simulate(draw(seed, ("storm",)), "python")
    assert not check(rec, sim), f"seed {seed} fails with the echo check too"


def test_without_join_a_swap_deadlocks() -> None:
    seed, why = _first_violation(("swap", "storm"), 30_000, engine={"join_after": 1e9})
    assert seed >= 0, f"no violation in {BUDGET} swap seeds without JOIN"
    assert "liveness" in why or "failure" in why, why
    rec, sim = simulate(draw(seed, ("swap", "storm")), "python")
    assert not check(rec, sim), f"seed {seed} fails with JOIN too"


def test_without_the_chase_a_displaced_chunk_never_reaches_a_round() -> None:
    seed, why = _first_violation((STRAGGLER,), 0, faults={"no_chase": True})
    assert seed >= 0, f"no violation in {BUDGET} straggler seeds without the chase"
    assert "starvation" in why, why
    rec, sim = simulate(draw(seed, (STRAGGLER,)), "python")
    assert not check(rec, sim), f"seed {seed} fails with the chase too"


def test_without_the_install_epoch_a_readd_inherits_rounds() -> None:
    seed, why = _first_violation(("readd",), 40_000, make_pipeline=NoEpochPipeline)
    assert seed >= 0, f"no violation in {BUDGET} re-install seeds without the epoch"
    rec, sim = simulate(draw(seed, ("readd",)), "python")
    assert not check(rec, sim), f"seed {seed} fails with the install epoch too"


def test_without_the_install_tag_a_restart_goes_unnoticed() -> None:
    seed, why = _first_violation(("restart", "readd"), 50_000, make_pipeline=NoTagPipeline)
    assert seed >= 0, f"no violation in {BUDGET} restart seeds without the install tag"
    rec, sim = simulate(draw(seed, ("restart", "readd")), "python")
    assert not check(rec, sim), f"seed {seed} fails with the install tag too"


# The plans replayed on the schedule they were found on (plan.PROBE_PERIOD_AS_FOUND); each still
# passes on the engine's own.
FOUND_ON_PROBE_PERIOD = ("probe_relaunched", "join_copied")


@pytest.mark.parametrize(("name", "pipeline"), [("probe_relaunched", NoRefusalPipeline),
                                              ("late_resent", NoRefusalPipeline),
                                              ("join_copied", NoJoinMarkPipeline)])
def test_without_the_refusal_marks_a_duplicate_counts_twice(name: str, pipeline: type) -> None:
    plan = Plan.from_json((Path(__file__).parent / "plans" / f"{name}.json").read_text())
    found_on = {"faults": PROBE_PERIOD_AS_FOUND} if name in FOUND_ON_PROBE_PERIOD else {}
    rec, sim = simulate(plan, "python", make_pipeline=pipeline, **found_on)
    found = check(rec, sim)
    assert found and "exactly-once" in found[0], found
    rec, sim = simulate(plan, "python", **found_on)
    assert not check(rec, sim), f"{name} fails with the marks too"
    rec, sim = simulate(plan, "python")
    assert not check(rec, sim), f"{name} fails on the engine's own schedule"


def test_without_the_sentinel_a_non_finite_gradient_is_lost() -> None:
    """The quantizer as it was: NaN sent as 0, an infinity or 1e30 pinned at the bound (and
    the rest kept in the residual for ever): the non-finite value never reaches the job."""
    seed, why = _first_violation(FAULT_KINDS, 0, faults={"pin_overflow": True})
    assert seed >= 0, f"no violation in {BUDGET} seeds with overflow pinned at the bound"
    assert "non-finite" in why and "lost" in why, why
    rec, sim = simulate(draw(seed), "python")
    assert not check(rec, sim), f"seed {seed} fails with the sentinel too"



class NoWindowPipeline(Pipeline):
    """The reference model with the async window taken out: an async slot counts any number
    but the one its member cell counted last, so a copy delayed behind the member's next
    contribution counts again."""

    def _behind(self, seq_index, r, epoch):  # type: ignore[no-untyped-def]
        return False


# A seed of the 9,000,000 sweep whose network duplicates a member's async contribution and
# delivers the copy behind the member's next one on the slot (docs/protocol.md §4 step 10).
ASYNC_COPY_BEHIND_SEED = 9000372


def test_without_the_async_window_a_copy_behind_the_next_counts_twice() -> None:
    plan = draw(ASYNC_COPY_BEHIND_SEED)
    assert plan.reorder_async
    rec, sim = simulate(plan, "python", make_pipeline=NoWindowPipeline)
    found = check(rec, sim)
    assert found and "exactly-once" in found[0], found
    rec, sim = simulate(plan, "python")
    assert not check(rec, sim), f"seed {ASYNC_COPY_BEHIND_SEED} fails with the window too"

# Seeds of hosts of several ranks (`--hosts drawn`) on a slow switch in partial, where an
# abort (a re-install, a restart) left members with different counting histories: when each
# member sent a slot's chunks least recently counted by itself first, members opened rounds
# of different chunks and retargeted into each other's, and a chunk reached no round in any
# of the calls judged (docs/protocol.md §9 "Sync / partial sending", bounded staleness). The
# order is now read from the results every member applies. 1001019 starves in the fixed
# order too; 1000828 only where members' orders depart.
SHARED_ORDER_SEEDS = (1001019, 1000828)


@pytest.mark.parametrize("seed", SHARED_ORDER_SEEDS)
@pytest.mark.parametrize("target", ["python", "native"])
def test_partial_calls_after_an_abort_send_in_one_order(seed: int, target: str) -> None:
    plan = draw(seed, FAULT_KINDS + HOST_KINDS, HOSTS_DRAWN)
    rec, sim = simulate(plan, target)
    found = check(rec, sim)
    assert not found, f"seed {seed} on {target}: {found[:3]}"


def test_in_the_fixed_order_a_partial_chunk_starves_after_an_abort() -> None:
    """With the re-offer taken out too: a chunk displaced by a round of its own key's chunk,
    offered again once that round closes, reaches a round in the fixed order as well."""
    plan = draw(SHARED_ORDER_SEEDS[0], FAULT_KINDS + HOST_KINDS, HOSTS_DRAWN)
    rec, sim = simulate(plan, "python", faults={"fixed_order": True, "no_reoffer": True})
    found = [v for v in check(rec, sim) if v.startswith("starvation:")]
    assert any("chunk(s) [0] of key 0" in v for v in found), check(rec, sim)[:3]
