"""Scenario files: every shipped one loads; bad ones are refused with a clear message."""

from __future__ import annotations

from pathlib import Path

import pytest

from hysync.topologies.scenario import ScenarioError, load_scenario

SCENARIO_DIR = Path(__file__).resolve().parents[2] / "topologies" / "scenarios"
SCENARIOS = sorted(SCENARIO_DIR.glob("*.toml"))


@pytest.mark.parametrize("path", SCENARIOS, ids=lambda p: p.stem)
def test_every_shipped_scenario_loads(path):
    scenario = load_scenario(path)
    assert scenario.name and scenario.workers >= 2 and scenario.steps > 0


def test_demo_scenario_has_one_straggler_that_recovers_and_no_schedule():
    demo = load_scenario(SCENARIO_DIR / "demo.toml")
    assert [(s.worker, s.pattern) for s in demo.stragglers] == [(3, "recovering")]
    assert demo.stragglers[0].factor_at(0.0) > 1 and demo.stragglers[0].factor_at(1e6) == 1
    assert not demo.schedule  # the adaptive policy decides


def test_manual_demo_scenario_swaps_to_partial_early():
    manual = load_scenario(SCENARIO_DIR / "demo-manual.toml")
    assert [s.worker for s in manual.stragglers] == [3]
    swap = manual.schedule[0]
    assert swap.mode == "partial" and swap.quorum == 3
    # well before the target (about a third of the steps with a straggler in sync)
    assert swap.at_step <= manual.steps // 10


def test_model_is_chosen_by_the_scenario(tmp_path):
    f = tmp_path / "s.toml"
    f.write_text('name="x"\nworkers=2\nsteps=1\n')
    assert load_scenario(f).model == "mlp"
    f.write_text('name="x"\nworkers=2\nsteps=1\nmodel="cnn"\n')
    assert load_scenario(f).model == "cnn"
    assert load_scenario(SCENARIO_DIR / "cnn.toml").model == "cnn"


def test_straggler_patterns_follow_their_timelines(tmp_path):
    f = tmp_path / "s.toml"
    f.write_text('name="x"\nworkers=4\nsteps=1\n'
                 '[[straggler]]\nworker=1\npattern="intermittent"\nfactor=3.0\nperiod_s=2.0\n'
                 'duty=0.25\n'
                 '[[straggler]]\nworker=2\npattern="recovering"\nfactor=2.0\nuntil_s=5.0\n'
                 '[[straggler]]\nworker=3\npattern="dies"\nat_s=4.0\n')
    s = load_scenario(f)
    inter, rec, dies = (s.straggler(w) for w in (1, 2, 3))
    assert [inter.factor_at(t) for t in (0.1, 0.6, 2.2, 3.0)] == [3.0, 1.0, 3.0, 1.0]
    assert (rec.factor_at(4.9), rec.factor_at(5.1)) == (2.0, 1.0)
    assert (dies.dead_at(3.9), dies.dead_at(4.0)) == (False, True)
    assert s.straggler(0) is None


@pytest.mark.parametrize("body, message", [
    ('workers=4\nsteps=10\n', "missing 'name'"),
    ('name="x"\nworkers=1\nsteps=10\n', "'workers' = 1 is out of range"),
    ('name="x"\nworkers=4\nsteps="ten"\n', "'steps' must be a int"),
    ('name="x"\nworkers=4\nsteps=10\nspeed=3\n', "unknown field(s) ['speed']"),
    ('name="x"\nworkers=4\nsteps=10\n[[straggler]]\nworker=7\npattern="constant"\n',
     "'worker' = 7 is out of range: a worker id 0..3"),
    ('name="x"\nworkers=4\nsteps=10\n[[straggler]]\nworker=1\npattern="slow"\n',
     "one of constant, intermittent, recovering, dies"),
    ('name="x"\nworkers=4\nsteps=10\n[[straggler]]\nworker=1\npattern="constant"\nfactor=0.5\n',
     "a slowdown 1..1000"),
    ('name="x"\nworkers=4\nsteps=10\n[[schedule]]\nat_step=3\nmode="partial"\n',
     "partial needs 'quorum' = 1..4"),
    ('name="x"\nworkers=4\nsteps=10\n[[schedule]]\nat_step=3\nmode="fast"\n',
     "one of sync, partial, async"),
    ('name="x"\nworkers=4\nsteps=10\nlr=0\n', "'lr' = 0.0 is out of range: a rate in (0, 10]"),
    ('name = \n', "not valid TOML"),
    ('name="x"\nworkers=4\nsteps=10\nmodel="resnet"\n',
     "'model' = 'resnet' is out of range: one of mlp, cnn"),
])
def test_bad_scenarios_are_refused_naming_the_field(tmp_path, body, message):
    f = tmp_path / "bad.toml"
    f.write_text(body)
    with pytest.raises(ScenarioError) as err:
        load_scenario(f)
    assert message in str(err.value)


def test_missing_scenario_file_says_where_to_look(tmp_path):
    with pytest.raises(ScenarioError, match="cannot read the scenario file .*nope.toml: No such "
                       "file or directory; pass a scenario such as topologies/scenarios/"):
        load_scenario(tmp_path / "nope.toml")


@pytest.mark.parametrize("module", ["hysync.topologies.demo", "hysync.topologies.run"])
def test_a_binary_scenario_is_one_line_and_exit_2(tmp_path: Path, module: str, capsys) -> None:
    import importlib

    binary = tmp_path / "scenario.toml"
    binary.write_bytes(b"name = \"\xff\"\n")
    main = importlib.import_module(module).main
    argv = [str(binary)] if module == "hysync.topologies.run" else ["--scenario", str(binary)]
    assert main(argv) == 2
    err = capsys.readouterr().err
    assert err.count("\n") == 1 and "scenario.toml is not UTF-8 text" in err


def test_slow_rack_scenario_is_two_racks_with_the_second_slower():
    slow = load_scenario(SCENARIO_DIR / "slow-rack.toml")
    assert (slow.racks, slow.per_rack) == (2, 3)
    assert [slow.rack_of(w) for w in range(slow.workers)] == [0, 0, 0, 1, 1, 1]
    assert {s.worker: s.factor_at(0.0) for s in slow.stragglers} == {3: 2.0, 4: 2.0, 5: 2.0}
    assert not slow.schedule  # the per-level adaptive policy decides


def test_racks_and_levels_are_read(tmp_path):
    f = tmp_path / "s.toml"
    f.write_text('name="x"\nworkers=4\nsteps=1\n')
    assert load_scenario(f).racks == 1  # one switch unless told
    f.write_text('name="x"\nworkers=6\nracks=2\nsteps=10\n'
                 '[[schedule]]\nat_step=3\nmode="partial"\nquorum=1\nlevel="spine"\n'
                 '[[schedule]]\nat_step=5\nmode="partial"\nquorum=2\nlevel="leaf:leaf-2"\n'
                 '[[schedule]]\nat_step=8\nmode="sync"\n')
    s = load_scenario(f)
    assert [(w.mode, w.quorum, w.level) for w in s.schedule] == [
        ("partial", 1, "spine"), ("partial", 2, "leaf:leaf-2"), ("sync", 0, "")]


RACKED = 'name="x"\nworkers=6\nracks=2\nsteps=10\n'


@pytest.mark.parametrize("body, message", [
    ('name="x"\nworkers=6\nsteps=10\nracks=9\n',
     "'racks' = 9 is out of range: 1 (one switch) or 2..8 racks"),
    ('name="x"\nworkers=6\nsteps=10\nracks=0\n', "'racks' = 0 is out of range"),
    ('name="x"\nworkers=6\nsteps=10\nracks="two"\n', "'racks' must be a int, got 'two'"),
    ('name="x"\nworkers=5\nsteps=10\nracks=2\n',
     "'workers' = 5 cannot fill 'racks' = 2 evenly with at least 2 each"),
    ('name="x"\nworkers=3\nsteps=10\nracks=3\n',
     "'workers' = 3 cannot fill 'racks' = 3 evenly with at least 2 each"),
    ('name="x"\nworkers=4\nsteps=10\n[[schedule]]\nat_step=3\nmode="sync"\nlevel="spine"\n',
     "'level' = 'spine' needs racks >= 2 (one switch has one level)"),
    (RACKED + '[[schedule]]\nat_step=3\nmode="sync"\nlevel="leaf-3"\n',
     "'level' = 'leaf-3' is not a level: write spine, leaf (every leaf) or one of "
     "leaf:leaf-1, leaf:leaf-2"),
    (RACKED + '[[schedule]]\nat_step=3\nmode="sync"\nlevel=1\n', "'level' = 1 is not a level"),
    (RACKED + '[[schedule]]\nat_step=3\nmode="async"\n',
     "async is not offered across switches (racks = 2): choose sync or partial"),
    (RACKED + '[[schedule]]\nat_step=3\nmode="partial"\nquorum=3\nlevel="spine"\n',
     "'quorum' = 3 is more than the 2 members at spine"),
    (RACKED + '[[schedule]]\nat_step=3\nmode="partial"\nquorum=4\nlevel="leaf"\n',
     "'quorum' = 4 is more than the 3 members at leaf"),
    (RACKED + '[[schedule]]\nat_step=3\nmode="partial"\nquorum=3\n',
     "'quorum' = 3 is more than the 2 members at every level"),
])
def test_bad_racks_and_levels_are_refused_in_one_line(tmp_path, body, message):
    f = tmp_path / "bad.toml"
    f.write_text(body)
    with pytest.raises(ScenarioError) as err:
        load_scenario(f)
    assert message in str(err.value) and "\n" not in str(err.value)


def test_run_takes_a_scenario_name_and_refuses_async_across_racks(capsys) -> None:
    from hysync.topologies.run import main

    assert main(["slow-rack", "--policy", "async"]) == 2
    err = capsys.readouterr().err
    assert err.count("\n") == 1 and "slow-rack spans 2 racks" in err, err
    assert main(["slow-rack", "--policy", "partial", "--quorum", "4"]) == 2
    err = capsys.readouterr().err
    assert err.count("\n") == 1 and "--quorum 4 must be 1..3" in err, err
