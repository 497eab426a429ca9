"""The summary's opening sentence: the policy's configuration against the others."""

from __future__ import annotations

from hysync.topologies.report import ConfigSummary, level_rows, outcome, time_split_rows


def summary(config: str, time_to_target: float | None, wait_ms: float | None = 10.0,
            comm_ms: float = 5.0, compute_ms: float = 50.0) -> ConfigSummary:
    return ConfigSummary(config, time_to_target, 0.96, 10.0, 300, 30.0, 300.0, compute_ms,
                         wait_ms, comm_ms)


def test_outcome_gives_each_ratio_with_the_others_times():
    text = outcome([summary("gloo", 17.5), summary("hysync-sync", 18.0),
                    summary("hysync-adaptive", 6.3)], 0.93)
    assert text == ("hysync-adaptive reached 93% held-out accuracy in 6.3 s: 2.8x faster than "
                    "gloo (17.5 s), 2.9x faster than hysync-sync (18.0 s).")


def test_outcome_says_so_when_the_policy_loses():
    text = outcome([summary("gloo", 9.4), summary("hysync-sync", 121.4)], 0.95)
    assert text == ("hysync-sync reached 95% held-out accuracy in 121.4 s: 12.9x slower than "
                    "gloo (9.4 s).")


def test_outcome_when_targets_are_missed_or_there_is_nothing_to_compare():
    assert outcome([summary("gloo", None), summary("hysync-adaptive", 5.0)], 0.9) == (
        "hysync-adaptive reached 90% held-out accuracy in 5.0 s: gloo did not reach it.")
    assert outcome([summary("gloo", 4.0), summary("hysync-adaptive", None)], 0.9) == (
        "hysync-adaptive did not reach 90% held-out accuracy (gloo in 4.0 s did).")
    assert outcome([summary("hysync-sync", 3.0)], 0.8) == (
        "hysync-sync reached 80% held-out accuracy in 3.0 s.")


def test_time_split_names_what_dominates_and_leaves_gloo_waiting_blank():
    rows = time_split_rows([summary("gloo", 1.0, wait_ms=None, comm_ms=33.0, compute_ms=33.3),
                            summary("hysync-sync", 1.0, wait_ms=651.0, comm_ms=232.0,
                                    compute_ms=99.0)])
    assert rows == [["gloo", "33.3", "-", "33.0", "compute"],
                    ["hysync-sync", "99.0", "651.0", "232.0", "waiting for the switch"]]


def test_level_rows_show_each_level_of_a_run_across_switches():
    def swap(level: str, mode: str, quorum: int, step: int) -> dict:
        return {"action": "set_mode", "level": level, "mode": mode, "quorum": quorum,
                "at_step": step}

    events = {"gloo": [], "hysync-adaptive": [
        swap("leaf:leaf-2", "partial", 2, 10), swap("spine", "partial", 1, 12),
        swap("leaf:leaf-2", "sync", 0, 30), swap("", "sync", 0, 40),
        {"action": "exclude", "level": "", "mode": "", "quorum": 0, "at_step": 90}]}
    assert level_rows(events) == [
        ["hysync-adaptive", "leaf:leaf-2", "2", "step 10", "sync"],
        ["hysync-adaptive", "spine", "1", "step 12", "partial(1)"],
        ["hysync-adaptive", "every level", "1", "never", "sync"]]
    # one switch: no level, no rows (the one-switch report is unchanged)
    assert level_rows({"hysync-adaptive": [swap("", "partial", 3, 10)]}) == []
