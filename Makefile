# The two commands a new user needs: `make lab` and `make test`.
# Both create .venv and install the project first (llama-cpp-python compiles
# llama.cpp on its first install, about 5 minutes on 2 cores; pip's wheel cache
# makes later installs fast).

PYTHON ?= python3
VENV := .venv
BIN := $(VENV)/bin
STAMP := $(VENV)/.installed
LAB_ARGS ?= $(if $(filter 0,$(shell id -u)),--allow-root,)

.PHONY: install demo-model lab test lint format bench clean

$(STAMP): pyproject.toml
	$(PYTHON) -m venv $(VENV)
	$(BIN)/python -m pip install --upgrade pip
	$(BIN)/python -m pip install -e '.[test,lab]'
	touch $(STAMP)

install: $(STAMP)

demo-model: install
	$(BIN)/python -m jupyter_llm.demo --install demo

lab: demo-model
	$(BIN)/jupyter lab $(LAB_ARGS)

lint: install
	$(BIN)/ruff check .
	$(BIN)/ruff format --check .

test: lint
	$(BIN)/python -m pytest

format: install
	$(BIN)/ruff format .
	$(BIN)/ruff check --fix .

bench: install
	$(BIN)/python benchmarks/decode.py

clean:
	rm -rf $(VENV) .pytest_cache .ruff_cache
