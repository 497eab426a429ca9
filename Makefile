# HySync front door. `make help` lists the targets.
PYTHON ?= python3
VENV   ?= .venv
PY     := $(VENV)/bin/python
P4C    ?= p4c
P4SRC  := p4src/v1model/hysync.p4
P4OUT  := build/p4
BF_P4C ?= bf-p4c
# The SDE's .conf (what `hysync pipeline push` packs): the open-source driver does not run
# its generator, which is installed beside it.
P4C_GEN_CONF ?= $(dir $(realpath $(shell command -v $(BF_P4C) 2>/dev/null)))p4c-gen-conf
TNA_SRC := p4src/tna/hysync.p4
TNA_OUT := build/tna
PYTEST_ARGS ?=
SCENARIO ?= topologies/scenarios/demo.toml
SWITCH ?= softswitch
POLICY ?= adaptive

NATIVE_SOURCES := CMakeLists.txt $(shell find native -name '*.cc' -o -name '*.h' 2>/dev/null) \
                  hysync/wire.py hysync/gen_wire_header.py hysync/codegen.py $(wildcard hysync/protocol_spec/*.py)
ASAN_BUILD := build/asan
FUZZ_RUNS ?= 200000

.PHONY: help setup p4 p4-tofino test test-asan lint bench simulate demo emulate clean

help:
	@echo "make setup    create $(VENV) and install HySync with its dependencies (torch 2.13.0 CPU)"
	@echo "make p4       compile $(P4SRC) with p4c for BMv2 (needs p4c on PATH)"
	@echo "make p4-tofino  compile $(TNA_SRC) for Tofino 1 and 2 (needs $(BF_P4C) on PATH)"
	@echo "make demo     the main job: softswitch + controller + 4 workers on loopback, one a"
	@echo "              straggler: gloo vs HySync sync vs HySync adaptive (POLICY=manual-schedule:"
	@echo "              gloo vs HySync swapping sync -> partial on the scenario's schedule)"
	@echo "make emulate  a Mininet run (root): SCENARIO=... SWITCH=softswitch|bmv2 POLICY=..."
	@echo "              (SCENARIO=slow-rack: racks behind leaves and a spine, in namespaces)"
	@echo "make test     set up if needed, lint, and run the test suite"
	@echo "make test-asan  fuzz the native core's parsers under ASan/UBSan (FUZZ_RUNS=$(FUZZ_RUNS) each)"
	@echo "make bench    run the benchmarks; numbers go to bench/results/"
	@echo "make simulate the deterministic simulation: SEEDS=$(SEEDS) from START=$(START) on"
	@echo "              TARGETS=$(TARGETS), faults KINDS=..., JOBS=processes (0: every CPU; SEED=n"
	@echo "              replays one; KINDS=straggler: the straggler plans; HOSTS=drawn: members"
	@echo "              are hosts of 1-8 ranks, HOSTS=32x4: 128 ranks on 32 hosts;"
	@echo "              FAULT_MODEL=full: tna-model meets every fault, not the Tofino's); numbers"
	@echo "              in bench/results/simulate.json"
	@echo "make clean    remove build outputs (keeps $(VENV))"

# The compiled core needs a C++17 compiler and CMake; say which package is missing.
$(VENV)/.toolchain:
	@command -v g++ >/dev/null 2>&1 || command -v c++ >/dev/null 2>&1 || { \
	  echo "No C++ compiler: HySync's native core needs one (Debian: apt-get install g++)"; exit 1; }
	@command -v cmake >/dev/null 2>&1 || { \
	  echo "No cmake: HySync's native core is built with CMake (Debian: apt-get install cmake)"; exit 1; }
	[ -x $(PY) ] || $(PYTHON) -m venv $(VENV)
	touch $@

$(VENV)/.deps: pyproject.toml $(VENV)/.toolchain
	$(PY) -m pip install --quiet --upgrade pip
	# Pinned: an unpinned torch pulls a multi-GB CUDA build.
	$(PY) -m pip install --quiet torch==2.13.0
	$(PY) -m pip install --quiet scikit-build-core nanobind numpy
	# examples/lightning_ddp.py and its test: Lightning without its dependencies, which name
	# an unpinned torch; the few pure-Python ones it imports are listed here.
	$(PY) -m pip install --quiet --no-deps pytorch-lightning==2.6.6 lightning-utilities \
	  torchmetrics tqdm pyyaml fsspec
	touch $@

# Rebuilt whenever the native sources or the wire format change.
$(VENV)/.installed: $(VENV)/.deps $(NATIVE_SOURCES)
	$(PY) -m pip install --quiet --no-build-isolation -e '.[test]'
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

# Both chips from one source; P4Info with standard extern messages (counters as P4Runtime
# counters), which Stratum and the controller read. Each chip is compiled whether or not
# the other one compiles; the compiler's own resource report of those that did is
# summarized in $(TNA_OUT)/resources.md (docs/tofino.md, Resources).
p4-tofino:
	@command -v $(BF_P4C) >/dev/null 2>&1 || { \
	  echo "$(BF_P4C) is not on PATH: build the open-source Tofino compiler (p4lang/p4c v1.2.5.8"; \
	  echo "with -DENABLE_TOFINO=ON, see docs/tofino.md 'Building the compiler'), install it, and"; \
	  echo "run 'make p4-tofino' again (or BF_P4C=/path/to/bf-p4c). The controller needs no"; \
	  echo "compiled output; a Tofino switch needs it."; exit 1; }
	@failed=; for target in tofino:tna tofino2:t2na; do \
	  chip=$${target%%:*}; arch=$${target##*:}; out=$(TNA_OUT)/$$chip; \
	  rm -rf $$out; mkdir -p $$out; \
	  echo "$(BF_P4C) --target $$chip --arch $$arch -> $$out (log: $(TNA_OUT)/compile-$$chip.log)"; \
	  if $(BF_P4C) --target $$chip --arch $$arch --std p4-16 -g --p4runtime-force-std-externs \
	       --p4runtime-files $$out/hysync.p4info.txtpb -o $$out $(TNA_SRC) > $(TNA_OUT)/compile-$$chip.log 2>&1 \
	     && $(P4C_GEN_CONF) --conf-type BF-RT --bfrt-name bfrt.json --device $$chip --name hysync \
	          --outputdir $$(cd $$out && pwd) --p4-version p4-16 --pipe pipe >> $(TNA_OUT)/compile-$$chip.log 2>&1; then \
	    echo "  $$chip: compiled ($$out/hysync.conf)"; \
	  else \
	    echo "  $$chip: FAILED, the compiler says:"; grep -A8 "error:" $(TNA_OUT)/compile-$$chip.log | grep -v "^\s*$$" | head -20; \
	    failed="$$failed $$chip"; \
	  fi; \
	 done; \
	 $(PYTHON) -m bench.tofino_resources $(TNA_OUT) > $(TNA_OUT)/resources.md || true; \
	 echo "P4Info: $(TNA_OUT)/<chip>/hysync.p4info.txtpb  resources (the compiler's): $(TNA_OUT)/resources.md"; \
	 if [ -n "$$failed" ]; then echo "make p4-tofino: did not compile for:$$failed (its compile log says why; docs/tofino.md, How Tofino 1 fits)"; exit 1; fi

lint: setup
	$(PY) -m ruff check hysync softswitch controlplane worker topologies tests bench examples .ci/wheel_smoke

test: setup lint
	$(PY) -m pytest -q $(PYTEST_ARGS)

# The fuzz targets (native/fuzz/fuzz_*.cc) under AddressSanitizer + UBSan: every parser of
# untrusted bytes in the core. Coverage-guided with clang's libFuzzer where clang++ is there.
test-asan: $(VENV)/.deps
	cmake -S . -B $(ASAN_BUILD) -DHYSYNC_FUZZ=ON -DPython_EXECUTABLE=$(abspath $(PY)) \
	  $$(command -v clang++ >/dev/null 2>&1 && echo -DCMAKE_CXX_COMPILER=clang++) >/dev/null
	cmake --build $(ASAN_BUILD) -j2
	@set -e; found=0; for f in $(ASAN_BUILD)/fuzz_*; do \
	  [ -x "$$f" ] || continue; found=1; echo "== $$f"; \
	  if command -v clang++ >/dev/null 2>&1; then "$$f" -runs=$(FUZZ_RUNS) -seed=1; \
	  else "$$f" $(FUZZ_RUNS) 1; fi; done; \
	  [ $$found = 1 ] || { echo "no fuzz target was built under $(ASAN_BUILD)"; exit 1; }

demo: setup
	$(PY) -m hysync.topologies.demo --policy $(POLICY)

emulate: setup
	$(PY) -m hysync.topologies.run $(SCENARIO) --switch $(SWITCH) --policy $(POLICY) --baseline

bench: setup
	$(PY) -m bench.run_all

# tests/sim: real worker engines and switch pipelines on a simulated network and clock.
SEEDS ?= 2000
START ?= 0
TARGETS ?= native,python
KINDS ?= swap,storm,pause,readd,restart,restart_bare,death,slow_switch,async_reorder,latch_loss
JOBS ?= 0
simulate: setup
	$(PY) -m tests.sim --targets $(TARGETS) --kinds $(KINDS) $(if $(SEED),--seed $(SEED),--seeds $(SEEDS) --start $(START) --jobs $(JOBS) --out bench/results/simulate.json) $(if $(HOSTS),--hosts $(HOSTS)) $(if $(FAULT_MODEL),--fault-model $(FAULT_MODEL))

clean:
	rm -rf build .pytest_cache .ruff_cache
	find . -name __pycache__ -type d -prune -exec rm -rf {} +
