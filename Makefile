# The two commands users need: `make experiment` (main job) and `make test`. Both set themselves up.
PY      ?= python3
VENV    := .venv
BIN     := $(VENV)/bin
TESTBED := $(BIN)/testbed
RESULTS := results

.PHONY: all venv sysdeps test unit integration lint experiment sim-paper figures bench topology-3dc clean distclean

all: test

$(BIN)/.installed: pyproject.toml
	$(PY) -m venv $(VENV)
	$(BIN)/pip install -q --upgrade pip
	$(BIN)/pip install -q -e '.[dev]'
	touch $@

venv: $(BIN)/.installed

sysdeps:
	@if [ "$$(id -u)" -eq 0 ]; then scripts/sysdeps.sh; \
	 else scripts/sysdeps.sh --check || echo "(not root: emulation steps and integration tests will be skipped)"; fi

lint: venv
	$(BIN)/ruff check testbed tests bench

unit: venv
	$(BIN)/pytest -q -m "not integration"

integration: venv sysdeps
	$(BIN)/pytest -q -m integration

test: venv sysdeps lint
	$(BIN)/pytest -q

sim-paper: venv
	$(TESTBED) sim experiments/paper-3dc.yaml --out $(RESULTS)/paper-3dc

experiment: venv sysdeps sim-paper
	$(TESTBED) figures $(RESULTS)/paper-3dc --out $(RESULTS)/figures

figures: venv
	@for d in $(RESULTS)/*/; do [ -f $$d/summary.csv ] && $(TESTBED) figures $$d --out $(RESULTS)/figures || true; done

bench: venv
	$(BIN)/python bench/sim_scale.py
	$(BIN)/python bench/mechanisms_example.py

clean:
	rm -rf .pytest_cache .ruff_cache build *.egg-info

distclean: clean
	rm -rf $(VENV)
