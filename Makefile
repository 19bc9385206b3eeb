# ServeLab — every user-facing command. README's two commands: `make demo`, `make test`.
SHELL := /bin/bash
PYTHON ?= python3
VENV := .venv
BIN := $(VENV)/bin
PY := $(BIN)/python
STAMP := $(VENV)/.servelab-installed

.PHONY: help setup sysdeps models demo test test-durations check up down triton site reference notebooks doctor soak fuzz clean kit-archive \
	gpu-pack gpu-check compose-check

help:
	@echo "make demo   - set up, build models, run the local stack and benchmark tour (README's main command)"
	@echo "make test   - set up and run the test suite (README's test command; .ci/run calls it)"
	@echo "make check  - ruff and the fast tier of tests (plain pytest: no servers, a few minutes)"
	@echo "make test-durations - make test, recording each test's seconds in tests/durations.json (commit it)"
	@echo "make up / make down - keep the local stack running for the browser UI and Jupyter / stop it"
	@echo "make models - build food11.pth / food11.onnx;  make site - render the lab as a static site"
	@echo "make reference - re-run notebooks 4, 6, 6a, 6e, 6f and the tour; write the committed docs/reference/"
	@echo "make soak   - long soak run;  make fuzz - longer fuzzing run"
	@echo "make kit-archive - dist/serve-system-chi.tar.gz (tracked files) for Trovi / Chameleon Jupyter"
	@echo "make compose-check - the Compose stacks for real on a local Docker engine (stand-in base images)"
	@echo "make gpu-pack - build/gpu-pack/, carried to a lent GPU machine;  make gpu-check - the GPU run there"

# One virtualenv with everything pinned in pyproject.toml.
$(STAMP): pyproject.toml
	test -x $(PY) || $(PYTHON) -m venv $(VENV)
	$(PY) -m pip install -q --upgrade pip
	$(PY) -m pip install -q -e ".[all]"
	$(PY) -m ipykernel install --sys-prefix --name python3 >/dev/null
	$(PY) -m servelab triton setup    # perf_analyzer shim: the lab's commands run verbatim
	touch $(STAMP)

setup: $(STAMP)

# Debian packages the tests run for real (no downloads from elsewhere): headless Chromium for the
# browser tests, HAProxy and Prometheus for the scale-out lesson (replicas behind a balancer).
SYSDEPS_BINS := /usr/bin/chromium /usr/bin/chromedriver /usr/sbin/haproxy /usr/bin/prometheus /usr/bin/promtool
SYSDEPS_PKGS := chromium chromium-driver haproxy prometheus
# make compose-check adds a Docker engine (Debian's docker.io) and mmdebstrap (the stand-in base images).
compose-check: SYSDEPS_BINS += /usr/sbin/dockerd /usr/bin/mmdebstrap
compose-check: SYSDEPS_PKGS += docker.io mmdebstrap
sysdeps:
	@missing=""; for b in $(SYSDEPS_BINS); do [ -x $$b ] || missing="$$missing $$b"; done; \
	if [ -n "$$missing" ]; then \
	  if [ "$$(id -u)" = 0 ] && command -v apt-get >/dev/null; then \
	    echo "installing Debian $(SYSDEPS_PKGS) (missing:$$missing)"; \
	    apt-get update -qq && DEBIAN_FRONTEND=noninteractive apt-get install -y -qq $(SYSDEPS_PKGS) >/dev/null; \
	  else echo "warning: missing$$missing; install Debian's $(SYSDEPS_PKGS)"; fi; \
	fi

models: setup
	$(PY) -m servelab models build

demo: models
	$(PY) -m servelab models predict
	$(PY) -m servelab tour

up: models
	$(PY) -m servelab up

down:
	$(PY) -m servelab down

# The fast tier only (tests/tiers.py: pure and in-process tests, each under a timeout; no server).
# `make test` runs it too, with the integration and e2e tiers.
check: setup models
	$(BIN)/ruff check .
	$(PY) -m pytest -q

# Only Triton, in the foreground, on 127.0.0.1:8000/8001/8002 (Ctrl-C stops it).
triton: models
	$(PY) -m servelab triton start

# Two phases (tests/schedule.py): the tests that time nothing on three workers, the longest recorded
# work first (tests/durations.json), then the `quiet` ones (they time runs, or judge whether other
# work spoiled them) alone. Both run; either one failing fails `make test`. Each names its -m, so
# every tier runs (plain `pytest`: the fast tier).
# Three workers even on two cores: phase 1's tests often wait on a server starting, and a third
# keeps the cores busy (2 idle cores, 2026-11-26: phase 1 580 s on two workers, 509 s on three).
WORKERS ?= 3
TESTFLAGS ?=
test: setup sysdeps models
	$(BIN)/ruff check .
	@rc=0; \
	echo "== phase 1 of 2: tests that time nothing, on $(WORKERS) workers"; \
	$(PY) -m pytest -q -n $(WORKERS) -m "not quiet" $(TESTFLAGS) || rc=1; \
	echo "== phase 2 of 2: tests that time runs (marked quiet), alone"; \
	$(PY) -m pytest -q -m quiet $(TESTFLAGS) || rc=1; \
	exit $$rc

# `make test`, writing each test's seconds (setup + call + teardown) into tests/durations.json, which
# phase 1 schedules from (tests/schedule.py). Commit the file after, when tests were added or their
# times moved much; a test it lacks still runs, at its tier's default estimate.
test-durations:
	$(MAKE) test TESTFLAGS=--record-durations

# The whole lab as a static HTML site (offline), from the notebook sources and the
# committed reference run in docs/reference/ (nothing is executed).
site: setup
	$(PY) -m servelab site

# Regenerate the committed reference run: notebooks 4, 6, 6a, 6e and 6f at the lesson's scale and the
# tour at scale 1 on the local stack. Commit docs/reference/ after (a test fails while it is stale).
reference: models
	$(PY) -m servelab reference build

# Rebuild notebooks/*.ipynb from notebooks/src/*.md after editing a source.
notebooks: setup
	$(PY) -m servelab notebooks build

# Longer fuzzing campaign (20x the cases `make test` runs). Every tier of these files (-o addopts=:
# the API and Flask fuzzers are integration tests), without the fast tier's hang guard (-p no:timeout).
fuzz: models
	SERVELAB_FUZZ=long $(PY) -m pytest tests/reliability/test_image_fuzz.py tests/reliability/test_api_fuzz.py tests/reliability/test_flask_fuzz.py -q -o addopts= -p no:timeout

# 50,000 requests at concurrency 16 (1 in 16 a large image) against FastAPI ONNX, Triton ONNX and
# Triton's Python model; prints every process's RSS curve and whether it plateaus. Then reloads under load.
soak: models
	$(PY) benchmarks/soak.py --targets fastapi_onnx,triton_onnx,triton_python
	$(PY) benchmarks/reload_under_load.py

doctor: setup
	$(PY) -m servelab doctor

# The kit as one archive (tracked files only), for an instructor to publish as the lab's
# Trovi artifact. Standard-library Python: no venv needed.
KIT_ARCHIVE ?= dist/serve-system-chi.tar.gz
kit-archive:
	$(PYTHON) -m servelab.node.chameleon pack $(KIT_ARCHIVE)

# The students' Compose stacks started for real on this machine's Docker engine, with stand-in base
# images where the upstream ones cannot be pulled (docker/standin/README.md); notebooks 4, 6, 6a and 6c
# executed inside the Jupyter container. Starts dockerd if none runs (and stops it after). Needs root.
compose-check: setup sysdeps
	$(PY) -m servelab.composecheck.check

# The GPU run (docs/gpu-reference.md). gpu-pack runs here: build/gpu-pack/ holds one xz archive
# (tritonserver + the 3.12 stub, perf_analyzer, numpy 1.26, the FastAPI set) that a bare GPU machine
# lacks. gpu-check runs there, on that machine's python3 (no venv, no setup): at most 8 minutes,
# at most 8 files in $$OUT (or GPU_CHECK_OUT). GPU_CHECK_ARGS="--device cpu --tiny" is the dry run.
gpu-pack: setup
	$(PY) -m servelab gpu-pack

GPU_CHECK_OUT ?= $(or $(OUT),results/gpu-check)
gpu-check:
	$(PYTHON) -m servelab.gpucheck --out $(GPU_CHECK_OUT) $(GPU_CHECK_ARGS)

clean:
	rm -rf build results .pytest_cache
