# The two commands a new user needs: `make lab` and `make test`.
# Both create .venv and install the project first (llama-cpp-python compiles
# llama.cpp on its first install, about 5 minutes on 2 cores; pip's wheel cache
# makes later installs fast). The install also builds the JupyterLab sidebar
# with Node and npm (about a minute the first time).
#
# GPUs: `make lab GPU=cuda` (or vulkan, metal; also `make install GPU=...`)
# builds llama-cpp-python for that backend into .venv-<backend>
# (scripts/build-runner-env; minutes the first time, then a cached wheel) and
# points .venv's server at it; `make lab` without GPU goes back to the CPU build.

PYTHON ?= python3
# Python caches compiled modules (and pytest its rewritten tests) only where
# bytecode may be written: a shell that forbids it made every pytest process,
# and every server a test starts, compile the project again (about 10 s each)
unexport PYTHONDONTWRITEBYTECODE
VENV := .venv
BIN := $(VENV)/bin
STAMP := $(VENV)/.installed
LAB_ARGS ?= $(if $(filter 0,$(shell id -u)),--allow-root,)
SUDO := $(if $(filter 0,$(shell id -u)),,sudo)
LABEXT := labextension
LABEXT_SOURCES := $(LABEXT)/package.json $(LABEXT)/package-lock.json \
	$(wildcard $(LABEXT)/src/*.ts $(LABEXT)/style/* $(LABEXT)/schema/*)
NODE_MODULES := $(LABEXT)/node_modules/.package-lock.json
CHROMIUM := /usr/bin/chromium
# npm's configurable-http-proxy, for the JupyterHub test (tests/hub/test_hub.py)
HUB_PROXY := tests/hub/node_modules/.package-lock.json

GPU ?=
RUNNER_ENV := scripts/build-runner-env

.PHONY: install demo-model lab test test-vulkan vulkan-env runner-env lint format bench clean browser hub-proxy

$(STAMP): pyproject.toml $(LABEXT_SOURCES)
	$(PYTHON) -m venv $(VENV)
	$(BIN)/python -m pip install --upgrade pip
	$(BIN)/python -m pip install -e '.[test,lab]'
	touch $(STAMP)

install: $(STAMP) $(if $(GPU),runner-env)

# the runners' interpreter: GPU=... builds and selects one, no GPU the CPU build
runner-env: $(STAMP)
	$(BIN)/python $(RUNNER_ENV) $(or $(GPU),cpu) --point $(VENV)

demo-model: install
	$(BIN)/python -m jupyter_llm.demo --install demo

lab: demo-model runner-env
	$(BIN)/jupyter lab $(LAB_ARGS)

# the install's build already ran npm; this only repairs a missing node_modules
$(NODE_MODULES): $(LABEXT)/package-lock.json
	cd $(LABEXT) && npm ci --no-audit --no-fund

# Debian's Chromium for the sidebar's browser test. Best effort: where it cannot
# be installed the test is skipped (and fails under CI, which must have it).
$(CHROMIUM):
	@{ command -v apt-get >/dev/null && $(SUDO) apt-get update -qq && \
		DEBIAN_FRONTEND=noninteractive $(SUDO) apt-get install -y -qq chromium; } || \
		echo "could not install Chromium at $(CHROMIUM): the browser test will be skipped"

browser: $(CHROMIUM)

# Best effort like Chromium: without it the JupyterHub test is skipped (and
# fails under CI, which must have it).
$(HUB_PROXY): tests/hub/package-lock.json
	@cd tests/hub && npm ci --no-audit --no-fund || \
		echo "could not install configurable-http-proxy: the JupyterHub test will be skipped"

hub-proxy: $(HUB_PROXY)

lint: install $(NODE_MODULES)
	$(BIN)/ruff check .
	$(BIN)/ruff format --check .
	cd $(LABEXT) && npm run lint

# pytest runs the suite on every core (pytest-xdist, each test file on one
# worker: most tests wait on a server or a runner), then the tests marked
# "alone" (they assert a ratio of times) by themselves. A red run ends with
# the names of what failed (scripts/test-failures, from JUnit reports).
PYTEST_WORKERS ?= auto
REPORTS := test-artifacts/reports

test: lint browser hub-proxy vulkan-env
	cd $(LABEXT) && npm test
	@rm -rf $(REPORTS)
	$(BIN)/python -m pytest -n $(PYTEST_WORKERS) --maxprocesses 4 --dist loadfile -m "not alone" \
		--junitxml=$(REPORTS)/parallel.xml || \
		{ $(BIN)/python scripts/test-failures $(REPORTS)/parallel.xml; exit 1; }
	$(BIN)/python -m pytest -m alone --junitxml=$(REPORTS)/alone.xml \
		$$(grep -rl --include='test_*.py' 'pytest.mark.alone' tests) || \
		{ $(BIN)/python scripts/test-failures $(REPORTS)/alone.xml; exit 1; }

# llama.cpp's Vulkan backend on Mesa's software driver (lavapipe): real layers
# offloaded to a real non-CPU ggml device (tests/vulkan), with the runners in
# .venv-vulkan. Installs Debian's Vulkan packages where apt-get is there; the
# build takes about 6 minutes once, then a cached wheel installs in seconds.
# Best effort for `make test`: where it cannot be built the Vulkan tests are
# skipped (and fail under CI, which must have them); `make test-vulkan` insists.
vulkan-env: install
	@$(BIN)/python $(RUNNER_ENV) vulkan || \
		echo "could not build .venv-vulkan: the Vulkan tests (tests/vulkan) will be skipped"

test-vulkan: install
	$(BIN)/python $(RUNNER_ENV) vulkan
	JUPYTER_LLM_TEST_VULKAN=1 $(BIN)/python -m pytest tests/vulkan

format: install $(NODE_MODULES)
	$(BIN)/ruff format .
	$(BIN)/ruff check --fix .
	cd $(LABEXT) && npm run format

bench: install
	$(BIN)/python benchmarks/decode.py

clean:
	rm -rf $(VENV) .venv-cuda .venv-vulkan .venv-metal .pytest_cache .ruff_cache test-artifacts jupyter_llm/labextension \
		$(LABEXT)/node_modules $(LABEXT)/lib $(LABEXT)/tsconfig.tsbuildinfo tests/hub/node_modules
