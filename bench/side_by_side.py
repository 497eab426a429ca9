"""Two builds of HySync, one bench, side by side: runs alternate A B A B ... so that the
load of a shared machine drifts over both alike.

    .venv/bin/python -m bench.side_by_side BEFORE_REPO AFTER_REPO --pairs 3 \\
        --result bench/results/worker.json \\
        --metric "10M_s=case=allreduce,elements=10000000,mode=sync:hysync_s" \\
        --out bench/results/compare.json --section worker -- -m bench.worker_bench --sizes 10000000

Each run is `nice <repo>/.venv/bin/python ARGS...` in that repo, so each tree runs with its
own virtual environment and build. A metric is `NAME=SELECTOR:FIELD`: the value of FIELD in
the first object of the run's result JSON (searched through its lists and objects) whose
keys match every `key=value` of SELECTOR (values compared as text; a list value counts as
its mean). The repos' result files are restored after each run, so neither tree's committed
numbers change. Writes the JSON (each run's numbers, medians, ratios after/before) after
every run, so a bench cut short keeps what it measured.
"""

from __future__ import annotations

import argparse
import json
import os
import shlex
import statistics
import subprocess
import sys
import time
from pathlib import Path
from typing import Any


def parse_metric(spec: str) -> tuple[str, dict[str, str], str]:
    """NAME=SELECTOR:FIELD -> (name, {key: value}, field)."""
    name, sep, rest = spec.partition("=")
    selector, colon, field = rest.rpartition(":")
    if not sep or not colon or not name or not field:
        raise ValueError(f"--metric {spec!r}: write NAME=key=value,...:FIELD, "
                         f"e.g. 10M_s=case=allreduce,elements=10000000:hysync_s")
    pairs = {}
    for part in filter(None, selector.split(",")):
        key, eq, value = part.partition("=")
        if not eq:
            raise ValueError(f"--metric {spec!r}: selector part {part!r} is not key=value")
        pairs[key] = value
    return name, pairs, field


def find(data: Any, selector: dict[str, str], field: str) -> float | None:
    """FIELD of the first object in data that matches selector, or None."""
    if isinstance(data, dict):
        if field in data and all(str(data.get(k)) == v for k, v in selector.items()):
            value = data[field]
            if isinstance(value, list):
                numbers = [v for v in value if isinstance(v, (int, float))]
                return statistics.mean(numbers) if numbers else None
            return value if isinstance(value, (int, float)) else None
        children = data.values()
    elif isinstance(data, list):
        children = data
    else:
        return None
    for child in children:
        found = find(child, selector, field)
        if found is not None:
            return found
    return None


def snapshot(folder: Path) -> dict[Path, bytes]:
    return {p: p.read_bytes() for p in folder.rglob("*") if p.is_file()} if folder.is_dir() else {}


def restore(folder: Path, before: dict[Path, bytes]) -> None:
    """Put folder back as snapshot() found it: changed files rewritten, new ones removed."""
    for path in list(folder.rglob("*")) if folder.is_dir() else []:
        if path.is_file() and path not in before:
            path.unlink()
    for path, data in before.items():
        if not path.is_file() or path.read_bytes() != data:
            path.write_bytes(data)


def run_once(repo: Path, args: list[str], result: Path, nice: int, timeout: float
             ) -> tuple[dict, float, int, str]:
    python = repo / ".venv" / "bin" / "python"
    if not python.is_file():
        raise SystemExit(f"{python} does not exist: run `make setup` in {repo} first")
    folder = (repo / result).parent
    kept = snapshot(folder)
    started = time.monotonic()
    try:
        proc = subprocess.run(["nice", "-n", str(nice), str(python), *args], cwd=repo,
                              capture_output=True, text=True, timeout=timeout)
        wall = time.monotonic() - started
        out = proc.stdout + proc.stderr
        data = json.loads((repo / result).read_text()) if proc.returncode == 0 else {}
        return data, wall, proc.returncode, out[-2000:]
    finally:
        restore(folder, kept)


def summarize(runs: list[dict], names: list[str]) -> dict:
    medians: dict[str, dict[str, float | None]] = {"before": {}, "after": {}}
    for side in medians:
        for name in names:
            values = [r["metrics"][name] for r in runs
                      if r["side"] == side and r["metrics"].get(name) is not None]
            medians[side][name] = statistics.median(values) if values else None
    ratios = {}
    for name in names:
        b, a = medians["before"][name], medians["after"][name]
        ratios[name] = round(a / b, 3) if a is not None and b else None
    return {"medians": medians, "ratios_after_over_before": ratios}


def write_section(out: Path, section: str, report: dict) -> None:
    sections = json.loads(out.read_text()) if out.is_file() else {}
    sections[section] = report
    out.parent.mkdir(parents=True, exist_ok=True)
    out.write_text(json.dumps(sections, indent=2) + "\n")


def main(argv: list[str] | None = None) -> None:
    argv = sys.argv[1:] if argv is None else argv
    command = "python -m bench.side_by_side " + shlex.join(argv)
    bench_args: list[str] = []
    if "--" in argv:
        cut = argv.index("--")
        argv, bench_args = argv[:cut], argv[cut + 1:]
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0],
                                     usage="%(prog)s BEFORE AFTER [options] -- BENCH ARGS")
    parser.add_argument("before", type=Path, help="the repo of the build measured first")
    parser.add_argument("after", type=Path)
    parser.add_argument("--pairs", type=int, default=3, help="before/after pairs (default 3)")
    parser.add_argument("--result", type=Path, required=True,
                        help="the JSON the bench writes, relative to each repo")
    parser.add_argument("--metric", action="append", required=True,
                        help="NAME=key=value,...:FIELD (repeatable)")
    parser.add_argument("--out", type=Path, required=True,
                        help="the comparison's JSON: an object of sections, one per bench")
    parser.add_argument("--section", required=True,
                        help="this bench's section in --out (the others are kept)")
    parser.add_argument("--nice", type=int, default=10, help="niceness of every run")
    parser.add_argument("--timeout", type=float, default=900, help="seconds per run")
    args = parser.parse_args(argv)
    if not bench_args:
        parser.error("give the bench after --, e.g. -- -m bench.worker_bench --sizes 10000000")
    if args.pairs < 1:
        parser.error(f"--pairs must be >= 1, got {args.pairs}")
    if args.result.is_absolute() or ".." in args.result.parts:
        parser.error(f"--result must be a path inside each repo (its folder is restored after "
                     f"every run), got {args.result}")
    try:
        metrics = [parse_metric(m) for m in args.metric]
    except ValueError as err:
        parser.error(str(err))
    repos = {"before": args.before.resolve(), "after": args.after.resolve()}
    report: dict[str, Any] = {
        "command": command,
        "bench": bench_args,
        "repos": {side: str(repo) for side, repo in repos.items()},
        "commits": {side: subprocess.run(["git", "-C", str(repo), "rev-parse", "--short", "HEAD"],
                                         capture_output=True, text=True).stdout.strip()
                    for side, repo in repos.items()},
        "cpus": os.cpu_count(),
        "runs": [],
    }
    names = [name for name, _, _ in metrics]
    for pair in range(args.pairs):
        for side in ("before", "after"):
            load = os.getloadavg()[0]
            data, wall, rc, tail = run_once(repos[side], bench_args, args.result, args.nice,
                                            args.timeout)
            values = {name: find(data, selector, field) for name, selector, field in metrics}
            run = {"pair": pair, "side": side, "rc": rc, "wall_s": round(wall, 1),
                   "load_1min_before": round(load, 1), "metrics": values}
            if rc != 0:
                run["output_tail"] = tail
            report["runs"].append(run)
            report.update(summarize(report["runs"], names))
            write_section(args.out, args.section, report)
            print(f"pair {pair + 1}/{args.pairs} {side}: rc {rc}, {wall:.0f} s, load {load:.1f}, "
                  + ", ".join(f"{k} {v}" for k, v in values.items()), flush=True)
    print(json.dumps(report["ratios_after_over_before"], indent=2))
    print(f"wrote {args.out}")


if __name__ == "__main__":
    main()
