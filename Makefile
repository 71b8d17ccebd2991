# The two commands users need: `make experiment` (main job) and `make test`. Both set themselves up.
PY      ?= python3
VENV    := .venv
BIN     := $(VENV)/bin
TESTBED := $(BIN)/testbed
RESULTS := results

.PHONY: all venv sysdeps test unit integration lint experiment sim-paper sim-bubbletea claims emu-multitcp emu-training \
        figures bench base-image docker-setup wheels images testbed-image emu-docker emu-docker-if-ready \
        topology-3dc topology-down clean distclean wan-change check-docs figure-families cluster-demo

all: test

$(BIN)/.installed: pyproject.toml
	$(PY) -m venv $(VENV)
	$(BIN)/pip install -q -e '.[dev,mininet,docker,ray]'
	@# torch compute: only the CPU wheel from this machine's wheel dir, never a CUDA build from an index
	@if ls /opt/wheels/torch-2.13.0+cpu-*.whl >/dev/null 2>&1; then $(BIN)/pip install -q 'torch==2.13.0'; \
	 else echo "no local CPU torch wheel: torch compute (emu-torch, its test) is skipped"; fi
	touch $@

venv: $(BIN)/.installed

sysdeps:
	@if [ "$$(id -u)" -eq 0 ]; then scripts/sysdeps.sh; \
	 else scripts/sysdeps.sh --check || echo "(not root: emulation steps and integration tests will be skipped)"; fi

lint: venv
	$(BIN)/ruff check testbed tests bench

unit: venv
	$(BIN)/pytest -q -m "not integration" -n auto

integration: venv sysdeps
	$(BIN)/pytest -q -m integration

# unit tests spread over the CPUs (pure logic: no shared state); integration tests one at a time (real kernel
# state and timing), their slowest printed
test: venv sysdeps lint
	$(BIN)/pytest -q -m "not integration" -n auto --durations=5
	$(BIN)/pytest -q -m integration --durations=15

sim-paper: venv
	$(TESTBED) sim experiments/paper-3dc.yaml --out $(RESULTS)/paper-3dc

# BubbleTea on the real Azure traces when ../shared/data has them, else on the synthetic trace.
AZURE := ../shared/data/azure-llm-inference-2023
# The same sweep again with fill work (jobs without a latency SLO in what prefill leaves: docs/bubbletea.md), and
# the knee without and with it side by side (bench/bubbletea_fill_knee.py fails if fill moved prefill or training)
FILL = --set "schedulers=[pp-wan+bubbletea, atlas+bubbletea]" --set bubbletea.fill.jobs_per_s=40
sim-bubbletea: venv
	@if [ -f $(AZURE)/AzureLLMInferenceTrace_conv.csv ]; then \
	  $(TESTBED) sim experiments/bubbletea-3dc.yaml --out $(RESULTS)/bubbletea-3dc && \
	  $(TESTBED) sim experiments/bubbletea-3dc.yaml --out $(RESULTS)/bubbletea-3dc-fill $(FILL) && \
	  $(TESTBED) sim experiments/bubbletea-3dc.yaml --out $(RESULTS)/bubbletea-3dc-code \
	    --set bubbletea.trace=$(abspath $(AZURE))/AzureLLMInferenceTrace_code.csv \
	    --set "schedulers=[atlas, atlas+bubbletea]" --sweep bubbletea.rate_scale=5,10,20,30,40,50; \
	else echo "no Azure trace in $(AZURE): BubbleTea runs on the synthetic trace (same statistics)"; \
	  $(TESTBED) sim experiments/bubbletea-3dc.yaml --out $(RESULTS)/bubbletea-3dc --set bubbletea.trace=synthetic && \
	  $(TESTBED) sim experiments/bubbletea-3dc.yaml --out $(RESULTS)/bubbletea-3dc-fill --set bubbletea.trace=synthetic \
	    $(FILL); fi
	$(BIN)/python bench/bubbletea_fill_knee.py $(RESULTS)/bubbletea-3dc $(RESULTS)/bubbletea-3dc-fill

# Every simulated number of README.md and docs/*.md that carries a `check:` anchor, regenerated and compared
# (bench/check_docs.py; the simulator is deterministic). CHECK_RUNS=paper,bubbletea checks only those runs
# (what CI does: the claims take minutes). Runs on the Azure traces are skipped, by name, where AZURE has none.
CHECK_RUNS ?=
check-docs: venv
	AZURE=$(abspath $(AZURE)) $(BIN)/python bench/check_docs.py $(if $(CHECK_RUNS),--runs $(CHECK_RUNS))

# Which family is fastest where (README "Which family, where"): paper-3dc and dtfm-8region over latency x capacity,
# every family; redraws docs/img/families-where.png.
figure-families: venv
	$(BIN)/python bench/families_where.py --out $(RESULTS)/families-where --figure docs/img/families-where.png

# Every published claim we can express (experiments/claims/*.yaml), against the simulator: claims.csv + claims.png.
claims: venv
	@if [ -f $(AZURE)/AzureLLMInferenceTrace_conv.csv ]; then $(TESTBED) claims --out $(RESULTS)/claims; \
	else echo "no Azure trace in $(AZURE): the BubbleTea claims run on the synthetic trace"; \
	  $(TESTBED) claims --out $(RESULTS)/claims --set bubbletea.trace=synthetic; fi

# The emulated parts need root; without it they are skipped with a message and the simulations still run.
# Each run holds its emulation prefix while it runs: PREFIX=gdtbN picks one, else every run takes the first
# free gdtb<N>. Nothing is cleaned first: a run never removes a prefix it did not start (testbed clean does,
# when asked, and leaves live runs alone).
PREFIX ?=
EMU := $(if $(PREFIX),--prefix $(PREFIX))
REPORT = $(TESTBED) report $(RESULTS)/$(1) --figures $(RESULTS)/figures/$(1)
emu-multitcp: venv sysdeps
	@if [ "$$(id -u)" -ne 0 ]; then echo "skipping the emulated multi-TCP experiment: it needs root (sudo make experiment)"; \
	 else $(TESTBED) experiment run experiments/multitcp.yaml $(EMU) --out $(RESULTS)/multitcp \
	   && $(call REPORT,multitcp); fi

emu-training: venv sysdeps
	@if [ "$$(id -u)" -ne 0 ]; then echo "skipping the emulated training run: it needs root (sudo make experiment)"; \
	 else $(TESTBED) experiment run experiments/emu-bubbletea.yaml $(EMU) --check --out $(RESULTS)/emu-bubbletea && \
	   $(call REPORT,emu-bubbletea) && \
	   $(TESTBED) experiment run experiments/emu-3dc.yaml $(EMU) --out $(RESULTS)/emu-3dc && \
	   $(call REPORT,emu-3dc) && \
	   if $(BIN)/python -c 'import torch' 2>/dev/null; then \
	     $(TESTBED) experiment run experiments/emu-torch.yaml $(EMU) --out $(RESULTS)/emu-torch && \
	     $(call REPORT,emu-torch) && \
	     $(TESTBED) experiment run experiments/emu-bubbletea-torch.yaml $(EMU) --out $(RESULTS)/emu-bubbletea-torch && \
	     $(call REPORT,emu-bubbletea-torch); \
	   else echo "torch not installed: skipping experiments/emu-torch.yaml and emu-bubbletea-torch.yaml"; fi; fi

# The backend comparison joins `make experiment` where the role images are built (sudo make docker-setup).
emu-docker-if-ready:
	@if [ "$$(id -u)" -eq 0 ] && docker image inspect gdtb/worker:latest gdtb/atlas:latest gdtb/bubbletea:latest \
	   >/dev/null 2>&1; then $(MAKE) --no-print-directory emu-docker; \
	 else echo "skipping the docker backend comparison: it needs root, a Docker engine and the role images \
	(sudo make docker-setup)"; fi

experiment: venv sysdeps sim-paper sim-bubbletea emu-multitcp emu-training emu-docker-if-ready
	$(call REPORT,paper-3dc)
	$(call REPORT,bubbletea-3dc)
	@if [ -f $(RESULTS)/bubbletea-3dc-code/summary.csv ]; then $(call REPORT,bubbletea-3dc-code); fi
	$(TESTBED) report --index $(RESULTS)
	@echo "open $(RESULTS)/index.html: one report per experiment (figures also in $(RESULTS)/figures/)"

# Images. BASE is any Python 3.11 on Debian bookworm: a registry's python:3.11-slim-bookworm by default,
# or the one `make base-image` builds from Debian packages (machines with no registry, like CI).
BASE ?= $(shell docker image inspect gdtb/base:bookworm >/dev/null 2>&1 && echo gdtb/base:bookworm \
          || echo python:3.11-slim-bookworm)
# Wheels come from build/wheels; on the debootstrap base, which has the Debian tools, builds get no
# network at all; on a registry base the atlas image apt-installs tc and iptables (host network).
DOCKER_BUILD = docker build -q --force-rm --network $(if $(filter gdtb/base%,$(BASE)),none,host) \
               --build-arg BASE=$(BASE)
base-image:
	scripts/base-image.sh gdtb/base:bookworm

# Everything the container backends need, as root: Debian's Docker engine and debootstrap, an engine
# started by hand where none runs (no systemd here), the base image and the role images.
docker-setup: venv
	scripts/sysdeps.sh --docker
	scripts/dockerd.sh start
	$(MAKE) base-image
	$(MAKE) images

wheels: venv
	scripts/wheelhouse.sh

images: wheels
	$(DOCKER_BUILD) -f containers/worker/Dockerfile -t gdtb/worker:latest .
	$(DOCKER_BUILD) -f containers/atlas/Dockerfile -t gdtb/atlas:latest .
	$(DOCKER_BUILD) -f containers/bubbletea/Dockerfile -t gdtb/bubbletea:latest .
	@docker images --format '{{.Repository}}:{{.Tag}} {{.Size}}' | grep '^gdtb/'

# The testbed itself in an image (run it privileged with the host's Docker socket; README). Its Debian
# tools come from the Debian mirror, so this build uses the host's network.
testbed-image: wheels
	docker build -q --force-rm --network host --build-arg BASE=$(BASE) -t gdtb/testbed:latest .

# The same 3-DC training experiment on the docker and netns backends, side by side (backends.csv).
emu-docker: venv sysdeps
	$(BIN)/python bench/backend_compare.py experiments/emu-docker.yaml $(EMU) --out $(RESULTS)/emu-docker
	$(call REPORT,emu-docker)

# One emulation over three machines (local containers with Ray inside, one DC each; docs/cluster.md): its WAN
# tunnels measured against the model and the single-machine run, a machine killed mid-run, nothing left anywhere.
# Skipped, with the reason, without root, a Docker engine, the role images (sudo make docker-setup) or Ray.
cluster-demo: venv sysdeps
	$(BIN)/python bench/cluster_demo.py --out $(RESULTS)/cluster-demo $(CLUSTER_DEMO_ARGS)

# Up + checked; stays up for `testbed topology exec useast-h0 -- ...`; `make topology-down` removes it.
# TOPO_PREFIX names it (default gdtb0, the topology commands' default).
TOPO_PREFIX ?= gdtb0
topology-3dc: venv sysdeps
	$(TESTBED) topology down --prefix $(TOPO_PREFIX) >/dev/null
	$(TESTBED) topology up topologies/3dc.yaml --prefix $(TOPO_PREFIX) --check --out $(RESULTS)/topology-3dc/links.csv
	$(call REPORT,topology-3dc)

topology-down: venv
	$(TESTBED) topology down --prefix $(TOPO_PREFIX)

figures: venv
	@for d in $(RESULTS)/*/; do n=$$(basename $$d); [ -f $$d/summary.csv ] && \
	  $(TESTBED) report $$d --figures $(RESULTS)/figures/$$n || true; done
	$(TESTBED) report --index $(RESULTS)

bench: venv
	$(BIN)/python bench/sim_scale.py
	$(BIN)/python bench/families_where.py --out $(RESULTS)/families-where
	$(BIN)/python bench/mechanisms_example.py
	$(BIN)/python bench/paper_speedups.py
	$(BIN)/python bench/turn_orders.py
	$(BIN)/python bench/prefill_model_error.py
	$(BIN)/python bench/paired_slowdown.py
	@if [ "$$(id -u)" -eq 0 ]; then $(BIN)/python bench/link_fidelity.py && $(BIN)/python bench/gpipe_arrivals.py \
	 && $(BIN)/python bench/lan_fidelity.py; else echo "link_fidelity, gpipe_arrivals and lan_fidelity need root"; fi

# Removes leftovers of emulated runs (namespaces, links, rules, processes with our prefix), then caches.
clean:
	@if [ "$$(id -u)" -eq 0 ] && [ -x $(TESTBED) ]; then $(TESTBED) clean; fi
	rm -rf .pytest_cache .ruff_cache build *.egg-info

distclean: clean
	rm -rf $(VENV)

# A WAN that changes (docs/wan-change.md): simulated, then emulated with the changes applied live (root).
wan-change: venv sysdeps
	$(TESTBED) sim experiments/wan-change.yaml --out $(RESULTS)/wan-change-sim
	@if [ "$$(id -u)" -ne 0 ]; then echo "skipping the emulated run: it needs root"; \
	 else $(TESTBED) clean --prefix gdtb1 && $(TESTBED) experiment run experiments/wan-change.yaml $(EMU) \
	   --out $(RESULTS)/wan-change && $(TESTBED) figures $(RESULTS)/wan-change --out $(RESULTS)/figures/wan-change; fi
