#!/usr/bin/env bash
# A source install as a user makes it: an sdist of the repository, then a wheel built from
# that sdist with pip's build isolation in a fresh venv that holds only torch 2.13.0 CPU
# (pinned, so pip pulls no CUDA build), installed there; smoke.py then runs from a
# temporary directory, no clone on sys.path, and runs the README's quick start.
set -euo pipefail
repo="$(cd "$(dirname "$0")/../.." && pwd)"
py="${PYTHON:-python3}"
tmp="$(mktemp -d /tmp/hysync-wheel.XXXXXX)"
trap 'rm -rf "$tmp"' EXIT
# the sdist: pypa/build (the repository's .venv has it, make setup) in its own isolated env
"$repo/.venv/bin/python" -m build --sdist --outdir "$tmp/sdist" "$repo" >"$tmp/sdist.log" 2>&1 \
  || { cat "$tmp/sdist.log"; exit 1; }
sdist="$(ls "$tmp"/sdist/hysync-*.tar.gz)"
echo "built $(basename "$sdist")"
"$py" -m venv "$tmp/venv"
vpy="$tmp/venv/bin/python"
"$vpy" -m pip install --quiet torch==2.13.0
# the wheel from the sdist alone, as `pip install hysync-*.tar.gz` builds it: pip unpacks
# it and installs the build requirements into an isolated environment of its own
"$vpy" -m pip wheel --no-deps -w "$tmp/dist" "$sdist" >"$tmp/wheel.log" 2>&1 \
  || { cat "$tmp/wheel.log"; exit 1; }
wheel="$(ls "$tmp"/dist/hysync-*.whl)"
echo "built $(basename "$wheel") from the sdist"
"$vpy" -m pip install --quiet "$wheel"
mkdir "$tmp/smoke"
cp "$repo"/.ci/wheel_smoke/{smoke,train,worker}.py "$tmp/smoke/"
cd "$tmp"
env -u PYTHONPATH "$vpy" "$tmp/smoke/smoke.py" "$wheel"
