# The two commands a new user needs: `make lab` and `make test`.
# Both create .venv and install the project first (llama-cpp-python compiles
# llama.cpp on its first install, about 5 minutes on 2 cores; pip's wheel cache
# makes later installs fast). The install also builds the JupyterLab sidebar
# with Node and npm (about a minute the first time).

PYTHON ?= python3
VENV := .venv
BIN := $(VENV)/bin
STAMP := $(VENV)/.installed
LAB_ARGS ?= $(if $(filter 0,$(shell id -u)),--allow-root,)
SUDO := $(if $(filter 0,$(shell id -u)),,sudo)
LABEXT := labextension
LABEXT_SOURCES := $(LABEXT)/package.json $(LABEXT)/package-lock.json \
	$(wildcard $(LABEXT)/src/*.ts $(LABEXT)/style/*)
NODE_MODULES := $(LABEXT)/node_modules/.package-lock.json
CHROMIUM := /usr/bin/chromium

.PHONY: install demo-model lab test lint format bench clean browser

$(STAMP): pyproject.toml $(LABEXT_SOURCES)
	$(PYTHON) -m venv $(VENV)
	$(BIN)/python -m pip install --upgrade pip
	$(BIN)/python -m pip install -e '.[test,lab]'
	touch $(STAMP)

install: $(STAMP)

demo-model: install
	$(BIN)/python -m jupyter_llm.demo --install demo

lab: demo-model
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

lint: install $(NODE_MODULES)
	$(BIN)/ruff check .
	$(BIN)/ruff format --check .
	cd $(LABEXT) && npm run lint

test: lint browser
	cd $(LABEXT) && npm test
	$(BIN)/python -m pytest

format: install $(NODE_MODULES)
	$(BIN)/ruff format .
	$(BIN)/ruff check --fix .
	cd $(LABEXT) && npm run format

bench: install
	$(BIN)/python benchmarks/decode.py

clean:
	rm -rf $(VENV) .pytest_cache .ruff_cache test-artifacts jupyter_llm/labextension \
		$(LABEXT)/node_modules $(LABEXT)/lib $(LABEXT)/tsconfig.tsbuildinfo
