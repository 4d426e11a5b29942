"""Scenario validation: every error names the file, the line and the field; nothing starts."""

from __future__ import annotations

import subprocess
import sys
import textwrap
from pathlib import Path
from typing import Any

import pytest

from engines.llamacpp import LlamaCpp
from harness.common.errors import ScenarioError
from harness.config.loader import load_scenario

GOOD = """\
name: t
server:
  model: model.gguf
configurations:
  - name: baseline
    algorithm: none
  - name: draft
    algorithm: draft-simple
    draft: draft.gguf
    k: 3
measurement:
  streams: [4, 1]
"""


def write(tmp_path: Path, text: str) -> Path:
    (tmp_path / "model.gguf").write_bytes(b"GGUF")
    (tmp_path / "draft.gguf").write_bytes(b"GGUF")
    p = tmp_path / "s.yaml"
    p.write_text(textwrap.dedent(text))
    return p


def test_good_scenario_resolves_models_relative_to_file(tmp_path: Path) -> None:
    loaded = load_scenario(write(tmp_path, GOOD), LlamaCpp.methods)
    assert loaded.scenario.measurement.streams == [1, 4]
    assert loaded.model_path("draft.gguf") == tmp_path / "draft.gguf"
    assert loaded.scenario.baseline() is not None


def test_package_model_reference_resolves_the_pypi_model() -> None:
    loaded = load_scenario(Path(__file__).parents[2] / "scenarios" / "quick.yaml", LlamaCpp.methods)
    path = loaded.target_of(loaded.scenario.configurations[0])
    assert path.name == "SmolLM2-135M-Instruct.Q4_1.gguf" and path.stat().st_size > 50 * 2**20


BAD = [
    (
        "unknown field",
        GOOD.replace("    k: 3", "    k: 3\n    kk: 4"),
        ":11: configurations[1].kk: unknown field 'kk'; allowed here: name, algorithm",
    ),
    (
        "k out of range",
        GOOD.replace("k: 3", "k: 99"),
        "configurations[1].k: Input should be less than or equal to 64 (got 99)",
    ),
    ("k zero", GOOD.replace("k: 3", "k: 0"), "configurations[1].k: Input should be greater than or equal to 1"),
    (
        "missing draft file",
        GOOD.replace("draft: draft.gguf", "draft: nope.gguf"),
        ":9: configurations[1].draft: no such model file",
    ),
    (
        "missing model package",
        GOOD.replace("model: model.gguf", "model: package:no-such-dist/x.gguf"),
        "server.model: PyPI package 'no-such-dist' is not installed",
    ),
    (
        "draft without draft model",
        GOOD.replace("    draft: draft.gguf\n", ""),
        "algorithm 'draft-simple' needs a 'draft' model",
    ),
    (
        "unknown algorithm",
        GOOD.replace("algorithm: draft-simple", "algorithm: medusa"),
        ":8: configurations[1].algorithm: unknown algorithm 'medusa'; known: draft-dflash",
    ),
    (
        "method the engine lacks",
        GOOD.replace("    algorithm: draft-simple\n    draft: draft.gguf\n", "    algorithm: suffix\n"),
        ":8: configurations[1].algorithm: engine 'llamacpp' has no method 'suffix'; it has: draft-dflash",
    ),
    (
        "unknown engine",
        GOOD.replace("server:\n", "server:\n  engine: tgi-x\n"),
        "server.engine: Input should be 'llamacpp'",
    ),
    (
        "duplicate names",
        GOOD.replace("name: draft\n", "name: baseline\n"),
        "configuration name 'baseline' is used twice",
    ),
    (
        "negative count",
        GOOD.replace("streams: [4, 1]", "streams: [4, -1]"),
        "measurement.streams[1]: Input should be greater than or equal to 1",
    ),
    (
        "wrong type",
        GOOD.replace("streams: [4, 1]", "streams: four"),
        "measurement.streams: Input should be a valid list",
    ),
    ("yaml syntax", GOOD.replace("  - name: baseline", "  - name: [baseline"), "YAML syntax error"),
    (
        "synthetic length above k+1",
        GOOD.replace("    k: 3", "    k: 3\n    synthetic: {length: 5}"),
        "synthetic.length must be within [1, k+1] = [1, 4], got 5",
    ),
    (
        "synthetic rates count",
        GOOD.replace("    k: 3", "    k: 3\n    synthetic: {rates: [0.9, 0.5]}"),
        "synthetic.rates must have k = 3 values, got 2",
    ),
    (
        "synthetic rates rising",
        GOOD.replace("    k: 3", "    k: 3\n    synthetic: {rates: [0.5, 0.9, 0.1]}"),
        "rates must be non-increasing",
    ),
    (
        "synthetic on baseline",
        GOOD.replace("    algorithm: none", "    algorithm: none\n    synthetic: {length: 2}"),
        "synthetic acceptance needs a speculative algorithm",
    ),
    (
        "absurd max_tokens",
        GOOD.replace("  streams: [4, 1]", "  streams: [4, 1]\n  max_tokens: 99999999"),
        "measurement.max_tokens: Input should be less than or equal to 131072",
    ),
    ("not a mapping", "- just\n- a list\n", "a scenario is a YAML mapping"),
    ("missing server", "name: t\nconfigurations: [{name: a}]\n", "server: required field is missing"),
]


@pytest.mark.parametrize(("label", "text", "expected"), BAD, ids=[b[0] for b in BAD])
def test_bad_scenarios_name_file_field_and_cause(tmp_path: Path, label: str, text: str, expected: str) -> None:
    path = write(tmp_path, text)
    with pytest.raises(ScenarioError) as info:
        load_scenario(path, LlamaCpp.methods)
    msg = str(info.value)
    assert msg.startswith(str(path)), msg
    assert expected in msg, msg
    assert "\n" not in msg


def test_missing_scenario_file(tmp_path: Path) -> None:
    with pytest.raises(ScenarioError, match="scenario file not found"):
        load_scenario(tmp_path / "nope.yaml")


def test_cli_validate_exit_code_2_one_line_no_traceback(tmp_path: Path) -> None:
    path = write(tmp_path, GOOD.replace("k: 3", "k: 99"))
    p = subprocess.run(
        [sys.executable, "-m", "harness.cli", "validate", str(path)],
        capture_output=True,
        text=True,
        timeout=120,
        check=False,
    )
    assert p.returncode == 2
    lines = [ln for ln in p.stderr.splitlines() if ln.strip()]
    assert len(lines) == 1 and lines[0].startswith("specsoak: error: ") and "configurations[1].k" in lines[0]
    assert "Traceback" not in p.stderr


def test_cli_validate_ok(tmp_path: Path) -> None:
    p = subprocess.run(
        [sys.executable, "-m", "harness.cli", "validate", str(write(tmp_path, GOOD))],
        capture_output=True,
        text=True,
        timeout=120,
        check=False,
    )
    assert p.returncode == 0, p.stderr
    assert "ok: 2 configurations" in p.stdout


def test_server_env_reaches_the_engine_process_and_bad_names_are_refused(tmp_path: Path) -> None:
    from harness.session.engine import launch_spec

    text = GOOD.replace(
        "  model: model.gguf\n",
        "  model: model.gguf\n  env: {VLLM_CPU_KVCACHE_SPACE: 1, SPECSOAK_ENV_OUT: %s}\n" % (tmp_path / "env.txt"),
    )
    loaded = load_scenario(write(tmp_path, text), LlamaCpp.methods)
    spec = launch_spec(loaded, loaded.scenario.runs()[0], 1234)
    assert dict(spec.env) == {"VLLM_CPU_KVCACHE_SPACE": "1", "SPECSOAK_ENV_OUT": str(tmp_path / "env.txt")}
    # the engine process sees it: a stand-in binary that writes its environment and exits
    fake = tmp_path / "fake-engine"
    fake.write_text('#!/bin/sh\nenv > "$SPECSOAK_ENV_OUT"\n')
    fake.chmod(0o755)
    from dataclasses import replace

    engine = LlamaCpp(replace(spec, binary=fake), tmp_path / "engine.log")
    engine.start()
    assert engine.proc is not None and engine.proc.wait(timeout=10) == 0
    engine.stop(1)
    assert "VLLM_CPU_KVCACHE_SPACE=1" in (tmp_path / "env.txt").read_text().splitlines()
    with pytest.raises(ScenarioError, match=r"server\.env\.1BAD"):
        load_scenario(
            write(tmp_path, GOOD.replace("  model: model.gguf\n", "  model: model.gguf\n  env: {1BAD: x}\n")),
            LlamaCpp.methods,
        )


OTHER_TARGET = (
    GOOD
    + """\
  - name: other-target
    algorithm: draft-simple
    model: draft.gguf
    draft: draft.gguf
    k: 2
"""
)


def test_a_speculative_configuration_on_another_target_than_every_baseline_is_refused(tmp_path: Path) -> None:
    path = write(
        tmp_path, OTHER_TARGET.replace("measurement:\n  streams: [4, 1]\n", "") + "measurement:\n  streams: [1]\n"
    )
    p = subprocess.run(
        [sys.executable, "-m", "harness.cli", "validate", str(path)],
        capture_output=True,
        text=True,
        timeout=120,
        check=False,
    )
    assert p.returncode == 2, p.stdout
    msg = " ".join(p.stderr.split())
    assert (
        "configuration 'other-target' targets draft.gguf, which no baseline serves (baselines: baseline on model.gguf)"
        in msg
    )


def test_an_explicit_baseline_pairs_across_models_and_must_be_a_baseline(tmp_path: Path) -> None:
    text = (
        OTHER_TARGET.replace("measurement:\n  streams: [4, 1]\n", "")
        + "    baseline: baseline\nmeasurement:\n  streams: [1]\n"
    )
    loaded = load_scenario(write(tmp_path, text), LlamaCpp.methods)
    sc = loaded.scenario
    assert sc.baseline_of(sc.runs()[2]).name == "baseline" and sc.baseline_of(sc.runs()[1]).name == "baseline"
    with pytest.raises(ScenarioError, match="baseline 'draft' is not a configuration with algorithm 'none'"):
        load_scenario(write(tmp_path, text.replace("baseline: baseline", "baseline: draft")), LlamaCpp.methods)


def test_measurement_verify_needs_a_baseline_and_rejects_an_unknown_field(tmp_path: Path) -> None:
    text = GOOD + "  verify: {prompts: 2, streams: 2}\n"
    v = load_scenario(write(tmp_path, text), LlamaCpp.methods).scenario.measurement.verify
    assert v is not None and (v.prompts, v.streams, v.max_tokens) == (2, 2, None)
    alone = text.replace("  - name: baseline\n    algorithm: none\n", "")
    with pytest.raises(ScenarioError, match=r"measurement\.verify compares with a baseline"):
        load_scenario(write(tmp_path, alone), LlamaCpp.methods)
    with pytest.raises(ScenarioError, match=r"verify.*promts"):
        load_scenario(write(tmp_path, text.replace("prompts: 2", "promts: 2")), LlamaCpp.methods)


def test_validate_prints_the_wall_clock_estimate_and_warns_about_slices(tmp_path: Path) -> None:
    text = GOOD + "soak:\n  duration_s: 7200\n  slice_s: 600\n"
    p = subprocess.run(
        [sys.executable, "-m", "harness.cli", "validate", str(write(tmp_path, text))],
        capture_output=True,
        text=True,
        timeout=120,
        env={**__import__("os").environ, "COLUMNS": "300"},
        check=False,
    )
    assert p.returncode == 0, p.stderr
    assert "soak 4.0 h" in p.stdout  # 2 configurations x 2 h
    # and the measurement again on each soaked engine, soak.after_repetitions (3) times: 3 min of phases in all
    assert "after soak 3 min" in p.stdout and "estimated wall clock 4.1 h" in p.stdout, p.stdout
    assert "soak.slice_s (10 min) restarts each configuration's engine every slice" in " ".join(p.stderr.split())


def _serve_once(body: bytes) -> tuple[str, Any]:
    """A loopback server answering GET /v1/models with ``body`` (a real llama-server capture)."""
    import http.server
    import threading

    class Handler(http.server.BaseHTTPRequestHandler):
        def do_GET(self) -> None:
            self.send_response(200 if self.path == "/v1/models" else 404)
            self.send_header("Content-Type", "application/json")
            self.end_headers()
            self.wfile.write(body)

        def log_message(self, *args: Any) -> None:
            pass

    srv = http.server.ThreadingHTTPServer(("127.0.0.1", 0), Handler)
    threading.Thread(target=srv.serve_forever, daemon=True).start()
    return f"http://127.0.0.1:{srv.server_address[1]}", srv


def test_attach_with_just_a_url_reads_the_model_from_the_server(tmp_path: Path) -> None:
    capture = (Path(__file__).resolve().parents[1] / "fixtures" / "llamacpp" / "base.GET_v1_models.txt").read_text()
    body = capture.split("\n\n", 1)[1].strip().encode()  # the capture's HTTP headers, then the body
    url, srv = _serve_once(body)
    try:
        path = tmp_path / "attach.yaml"
        path.write_text(
            f"name: a\nserver:\n  url: {url}\nconfigurations:\n  - {{name: base, algorithm: none}}\n"
            "measurement: {prompts: 'builtin:repeat'}\n"
        )
        loaded = load_scenario(path)
        assert loaded.scenario.server.model == "models/smollm2-135m-q4_1.gguf"
    finally:
        srv.shutdown()
    # the server gone: one line naming the field and what to do (exit 2 at the CLI)
    with pytest.raises(ScenarioError, match=r"server.model: not given, and the server at .* did not list its models"):
        load_scenario(path)
    # without server.url a model is still required
    path.write_text(
        "name: a\nserver: {engine: llamacpp}\nconfigurations:\n  - {name: base, algorithm: none}\n"
        "measurement: {prompts: 'builtin:repeat'}\n"
    )
    with pytest.raises(ScenarioError, match=r"server\.model is required"):
        load_scenario(path)
