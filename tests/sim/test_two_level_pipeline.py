"""The two-level model's checker on real pipelines (tests/sim/two_level_pipeline.py), the
reference one and the native one: their seeds hold every invariant with real leaves and a
real spine, and the checker sees a pipeline that lacks a rule of docs/protocol.md §11."""

from __future__ import annotations

import pytest

from hysync import wire
from hysync.softswitch.pipeline import Pipeline
from hysync.wire import Op
from tests.sim.two_level_pipeline import PipelineRun, main
from tests.softswitch.two_level_fabric import JOB

SEEDS = 300


@pytest.fixture(params=["python", "native"])
def target(request) -> str:
    return request.param


def test_seeds_hold_every_invariant(target):
    failing = {seed: problems for seed in range(SEEDS)
               if (problems := PipelineRun(seed, target=target).run())}
    assert not failing, f"{len(failing)} of {SEEDS} fail, first: {next(iter(failing.items()))}"


def first_failure(make_run) -> list[str]:
    for seed in range(SEEDS):
        problems = make_run(seed).run(budget=20_000)
        if problems:
            return problems
    pytest.fail(f"no seed of 0..{SEEDS - 1} breaks an invariant")


def without_marking_refused_hosts(pipeline: Pipeline, hosts: int) -> None:
    """The leaf's verdicts leave its hosts' member cells as they were: on the native engine,
    every cell is written back after a verdict (the verdict path writes them only to mark a
    refused sum's hosts)."""
    process = pipeline.process_datagram

    def process_datagram(src_ip: int, src_port: int, payload: bytes) -> list:
        if payload[wire.FIELD_OFFSET["op"]] not in (Op.RESULT, Op.RESYNC):
            return process(src_ip, src_port, payload)
        cells = [(pipeline.member_seq[h], pipeline.member_epoch[h]) for h in range(hosts)]
        out = process(src_ip, src_port, payload)
        for h, (seq, epoch) in enumerate(cells):
            pipeline.member_seq[h], pipeline.member_epoch[h] = seq, epoch
        return out

    pipeline.process_datagram = process_datagram  # type: ignore[method-assign]


def test_a_leaf_that_does_not_mark_a_refused_sums_hosts_breaks_exactly_once(target,
                                                                             monkeypatch):
    def unmarked(seed: int) -> PipelineRun:
        run = PipelineRun(seed, target=target)
        if target == "native":
            for leaf in run.fabric.leaf:
                without_marking_refused_hosts(leaf, run.d.hosts)
        return run

    if target == "python":
        monkeypatch.setattr(Pipeline, "_refuse_hosts", lambda self, s, hosts, r, epoch: None)
    problems = first_failure(unmarked)
    assert any(p.startswith("exactly-once") for p in problems), problems


def test_a_spine_that_counts_leaves_not_hosts_breaks_the_divisor(target):
    def single_spine(seed: int) -> PipelineRun:
        run = PipelineRun(seed, target=target)
        run.fabric.spine.set_role(JOB, None)  # §4 alone: a RESULT's count is the leaves
        return run

    problems = first_failure(single_spine)
    assert any(p.startswith("divisor") for p in problems), problems


def test_a_seed_replays(capsys, target):
    assert main(["--seed", "7", "--targets", target]) == 0
    assert f"seed 7 on {target}: no violation" in capsys.readouterr().out


def test_a_target_it_does_not_know_is_refused_in_one_line(capsys):
    with pytest.raises(SystemExit):
        main(["--seed", "7", "--targets", "python,bmv2"])
    assert "name one or more of python,native" in capsys.readouterr().err
