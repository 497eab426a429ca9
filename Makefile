# HySync front door. `make help` lists the targets.
PYTHON ?= python3
VENV   ?= .venv
PY     := $(VENV)/bin/python
P4C    ?= p4c
P4SRC  := p4src/v1model/hysync.p4
P4OUT  := build/p4
PYTEST_ARGS ?=
SCENARIO ?= topologies/scenarios/demo.toml
SWITCH ?= softswitch
POLICY ?= manual-schedule

.PHONY: help setup p4 test lint bench demo emulate clean

help:
	@echo "make setup    create $(VENV) and install HySync with its dependencies (torch 2.13.0 CPU)"
	@echo "make p4       compile $(P4SRC) with p4c for BMv2 (needs p4c on PATH)"
	@echo "make demo     the main job: softswitch + controller + 4 workers on loopback, a mode swap"
	@echo "              (POLICY=adaptive: the straggler policy swaps modes instead of the schedule)"
	@echo "make emulate  a Mininet run (root): SCENARIO=... SWITCH=softswitch|bmv2 POLICY=..."
	@echo "make test     set up if needed, lint, and run the test suite"
	@echo "make bench    run the benchmarks; numbers go to bench/results/"
	@echo "make clean    remove build outputs (keeps $(VENV))"

$(VENV)/.installed: pyproject.toml
	$(PYTHON) -m venv $(VENV)
	$(PY) -m pip install --quiet --upgrade pip
	# Pinned: an unpinned torch pulls a multi-GB CUDA build.
	$(PY) -m pip install --quiet torch==2.13.0
	$(PY) -m pip install --quiet -e '.[test]'
	touch $@

setup: $(VENV)/.installed

p4:
	@command -v $(P4C) >/dev/null 2>&1 || { \
	  echo "p4c is not on PATH: install p4c (p4lang/p4c, v1.2.5.8 or older builds with Debian 12's GCC)"; \
	  echo "and run 'make p4' again. The committed P4Info p4src/v1model/hysync.p4info.txtpb is the"; \
	  echo "control-plane contract; the softswitch needs no compiled output."; exit 1; }
	mkdir -p $(P4OUT)
	$(P4C) --target bmv2 --arch v1model --std p4-16 \
	  --p4runtime-files $(P4OUT)/hysync.p4info.txtpb -o $(P4OUT) $(P4SRC)
	@echo "BMv2 JSON: $(P4OUT)/hysync.json  P4Info: $(P4OUT)/hysync.p4info.txtpb"

lint: setup
	$(VENV)/bin/ruff check hysync softswitch controlplane worker topologies tests bench

test: setup lint
	$(PY) -m pytest -q $(PYTEST_ARGS)

demo: setup
	$(PY) -m topologies.demo --policy $(POLICY)

emulate: setup
	$(PY) -m topologies.run $(SCENARIO) --switch $(SWITCH) --policy $(POLICY) --baseline

bench: setup
	$(PY) -m bench.run_all

clean:
	rm -rf build .pytest_cache .ruff_cache
	find . -name __pycache__ -type d -prune -exec rm -rf {} +
