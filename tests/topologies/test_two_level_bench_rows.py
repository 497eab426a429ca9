"""bench.two_level_bench: how a run's rank lines become its row and the cells' ratios, and
one short load through a leaf and a spine (real softswitch processes on loopback)."""

from __future__ import annotations

from pathlib import Path

import pytest

from bench import two_level_bench as bench


def reached(rank: int, t: float) -> dict:
    return {"rank": rank, "rack": rank // bench.HOSTS, "reached": t, "steps": 10, "updates": 10}


def final(rank: int, accuracy: float) -> dict:
    return {"rank": rank, "rack": rank // bench.HOSTS, "accuracy": accuracy, "steps": 300,
            "updates": 300.0, "seconds": 30.0 + rank, "time_to_target": 1.0,
            "modes": {"sync": 5, "partial": 2}}


def test_a_run_reaches_the_target_when_its_slowest_rank_does() -> None:
    ranks = bench.RACKS * bench.HOSTS
    recs = [reached(r, 5.0 + r) for r in range(ranks)] + [final(r, 0.95) for r in range(ranks)]
    row = bench.summarize(recs, {"outcome": "completed", "wall_s": 60.0})
    assert row["time_to_target_s"] == 5.0 + ranks - 1
    assert row["rank0_time_to_target_s"] == 5.0
    assert row["train_s"] == 30.0 + ranks - 1
    assert row["results_by_mode"] == {"sync": 5 * ranks, "partial": 2 * ranks}
    # one rank short of the target: the run did not reach it, rank 0's time stays
    row = bench.summarize(recs[1:ranks], {"outcome": "ended_by_bench", "wall_s": 60.0})
    assert row["time_to_target_s"] is None and row["rank0_time_to_target_s"] is None
    assert row["reached_ranks"] == ranks - 1 and row["finished_ranks"] == 0


def test_cells_give_medians_and_speedups_over_gloo_and_sync() -> None:
    def run(config: str, scenario: str, t: float | None, outcome: str = "completed") -> dict:
        return {"config": config, "scenario": scenario, "time_to_target_s": t,
                "rank0_time_to_target_s": t, "outcome": outcome, "accuracy": [0.95, 0.94]}

    runs = [run("gloo", "slow-rack", 20.0), run("gloo", "slow-rack", 22.0),
            run("sync", "slow-rack", 16.0), run("adaptive", "slow-rack", 10.0),
            run("adaptive", "slow-rack", None, "torchrun exited 1"),
            run("sync", "none", 8.0)]
    rows = {(r["scenario"], r["config"]): r for r in bench.cells(runs)}
    assert rows["slow-rack", "gloo"]["time_to_target_s"]["median"] == 21.0
    adaptive = rows["slow-rack", "adaptive"]
    assert (adaptive["reached_target"], adaptive["failed"]) == ("1 of 2", 1)
    assert adaptive["speedup_over_gloo"] == 2.1 and adaptive["speedup_over_sync"] == 1.6
    assert rows["slow-rack", "sync"]["speedup_over_gloo"] == round(21 / 16, 2)
    assert "speedup_over_gloo" not in rows["none", "sync"]  # no gloo run in that scenario
    assert rows["slow-rack", "adaptive"]["final_accuracy_min"] == 0.94


def test_the_load_generators_workers_are_the_job_members_behind_their_leaves() -> None:
    members = bench.rate_members([2, 2], leaves=True)
    assert [(m["leaf"], m["worker"], m["udp_port"]) for m in members] == [
        ("leaf-0", 0, bench.RATE_BASE_PORT), ("leaf-0", 1, bench.RATE_BASE_PORT + 1),
        ("leaf-1", 0, bench.RATE_BASE_PORT + 10), ("leaf-1", 1, bench.RATE_BASE_PORT + 11)]
    one = bench.rate_members([4], leaves=False)
    assert [m["worker"] for m in one] == [0, 1, 2, 3] and "leaf" not in one[0]


@pytest.mark.slow
def test_a_stream_through_two_leaves_and_the_spine_comes_back(
        tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(bench, "RUNS", tmp_path)
    monkeypatch.setattr(bench, "WARMUP_S", 0.3)
    row = bench.rate_run("two-leaves", window=16, seconds=0.5)
    assert row["answered_per_s"] > 0 and all(p > 0 for p in row["per_generator"])
    # in sync every round of a slot needs both leaves: the two racks move together
    low, high = sorted(row["per_generator"])
    assert low >= 0.8 * high, row
    assert row["uplink_datagrams_per_s"] == [round(p / 2) for p in row["per_generator"]]
