#!/usr/bin/env bash
# The wheel alone: build it, install it into a fresh venv (torch 2.13.0 CPU first, so pip
# pulls no CUDA build), and run smoke.py from a temporary directory: no clone on sys.path.
set -euo pipefail
repo="$(cd "$(dirname "$0")/../.." && pwd)"
py="${PYTHON:-python3}"
tmp="$(mktemp -d /tmp/hysync-wheel.XXXXXX)"
trap 'rm -rf "$tmp"' EXIT
# the build runs in the repository's .venv (make setup), which has the build backend
"$repo/.venv/bin/python" -m pip wheel --quiet --no-deps --no-build-isolation -w "$tmp/dist" "$repo"
wheel="$(ls "$tmp"/dist/hysync-*.whl)"
echo "built $(basename "$wheel")"
"$py" -m venv "$tmp/venv"
"$tmp/venv/bin/python" -m pip install --quiet torch==2.13.0
"$tmp/venv/bin/python" -m pip install --quiet "$wheel"
mkdir "$tmp/smoke"
cp "$repo"/.ci/wheel_smoke/{smoke,train,worker}.py "$tmp/smoke/"
cd "$tmp"
env -u PYTHONPATH "$tmp/venv/bin/python" "$tmp/smoke/smoke.py" "$wheel"
