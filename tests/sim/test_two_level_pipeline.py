"""The two-level model's checker on the reference pipeline (tests/sim/two_level_pipeline.py):
its seeds hold every invariant with real leaves and a real spine, and the checker sees a
pipeline that lacks a rule of docs/protocol.md §11."""

from __future__ import annotations

import pytest

from hysync.softswitch.pipeline import Pipeline
from tests.sim.two_level_pipeline import PipelineRun, main
from tests.softswitch.two_level_fabric import JOB

SEEDS = 300


def test_seeds_hold_every_invariant_on_the_reference_pipeline():
    failing = {seed: problems for seed in range(SEEDS) if (problems := PipelineRun(seed).run())}
    assert not failing, f"{len(failing)} of {SEEDS} fail, first: {next(iter(failing.items()))}"


def first_failure(make_run) -> list[str]:
    for seed in range(SEEDS):
        problems = make_run(seed).run(budget=20_000)
        if problems:
            return problems
    pytest.fail(f"no seed of 0..{SEEDS - 1} breaks an invariant")


def test_a_leaf_that_does_not_mark_a_refused_sums_hosts_breaks_exactly_once(monkeypatch):
    monkeypatch.setattr(Pipeline, "_refuse_hosts", lambda self, s, hosts, r, epoch: None)
    problems = first_failure(PipelineRun)
    assert any(p.startswith("exactly-once") for p in problems), problems


def test_a_spine_that_counts_leaves_not_hosts_breaks_the_divisor():
    def single_spine(seed: int) -> PipelineRun:
        run = PipelineRun(seed)
        run.fabric.spine.set_role(JOB, None)  # §4 alone: a RESULT's count is the leaves
        return run

    problems = first_failure(single_spine)
    assert any(p.startswith("divisor") for p in problems), problems


def test_a_seed_replays(capsys):
    assert main(["--seed", "7"]) == 0
    assert "seed 7: no violation" in capsys.readouterr().out
