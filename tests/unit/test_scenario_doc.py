"""docs/scenarios.md is generated from the models and up to date; every field is in it; the engine map is true to
the adapters; `specsoak schema` and `specsoak plan` through the real command line."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest
import yaml

from engines import ENGINES
from engines.types import LaunchSpec
from harness.config.reference import ENGINE_FIELDS, IGNORED_BY, PROMPT_SET_PURPOSE, REGENERATE, fields, markdown
from harness.config.schema import DRAFT_MODEL_ALGORITHMS, ENGINE_NAMES, Scenario

ROOT = Path(__file__).resolve().parents[2]
DOC = ROOT / "docs" / "scenarios.md"


def cli(*args: str, env: dict[str, str] | None = None) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        [sys.executable, "-m", "harness.cli", *args],
        cwd=ROOT,
        capture_output=True,
        text=True,
        timeout=300,
        env={**os.environ, **(env or {})},
        check=False,
    )


def test_committed_doc_is_up_to_date() -> None:
    assert DOC.read_text(encoding="utf-8") == markdown(), (
        f"docs/scenarios.md is out of date: run `{REGENERATE}` to regenerate it"
    )


def test_every_field_of_every_model_is_documented() -> None:
    docs = fields()
    models = {f.model for f in docs}
    assert {
        "Scenario",
        "Server",
        "Configuration",
        "Synthetic",
        "Sweep",
        "Measurement",
        "Soak",
        "Shape",
        "Watchdog",
        "Slo",
        "Ramp",
        "ReportOptions",
    } <= {m.__name__ for m in models}
    text = DOC.read_text(encoding="utf-8")
    for f in docs:
        assert f"| `{f.path}` |" in text, f"{f.path} is not in docs/scenarios.md: run `{REGENERATE}`"
        assert f.info.description, (
            f"{f.model.__name__}.{f.name} ({f.path}) has no description: add one in harness/config/schema.py"
        )
    # and every model field is reached by the walk (a model nested in a new way would be missed silently)
    for model in models:
        assert {f.name for f in docs if f.model is model} == set(model.model_fields), model.__name__


def test_engine_map_names_real_fields_and_engines() -> None:
    paths = {f.path for f in fields()}
    for path, how in {**ENGINE_FIELDS, **{p: {} for p in IGNORED_BY}}.items():
        assert path in paths, f"ENGINE_FIELDS/IGNORED_BY: no field {path}"
        assert set(how) <= set(ENGINE_NAMES), path


def test_engine_map_agrees_with_the_adapters() -> None:
    synthetic = {e for e, cls in ENGINES.items() if cls.synthetic_acceptance}
    for path in (
        "configurations[].synthetic",
        "configurations[].synthetic.length",
        "configurations[].synthetic.rates",
        "configurations[].sweep.synthetic_length",
    ):
        assert set(ENGINE_FIELDS[path]) == synthetic, path
    assert set(ENGINE_FIELDS["report.fill_check"]) == {e for e, cls in ENGINES.items() if cls.ctx_sizes_kv}
    assert set(ENGINE_FIELDS["configurations[].draft"]) == {
        e for e, cls in ENGINES.items() if cls.methods & DRAFT_MODEL_ALGORITHMS
    }
    assert set(ENGINE_FIELDS["configurations[].algorithm"]) == set(ENGINES)

    # server.api_key_env: the engines listed get the key (environment or a masked flag); the others do not
    for name, cls in ENGINES.items():
        spec = LaunchSpec(
            model=Path("/m"), api_key="k3y", binary=Path("/x/bin/python3" if name == "sglang" else f"/x/bin/{name}")
        )
        engine = cls(spec, Path("/tmp/x.server.log"))
        given = "k3y" in engine.engine_env().values() or "k3y" in engine.command()
        assert given == (name in ENGINE_FIELDS["server.api_key_env"]), name


def test_every_builtin_prompt_set_has_a_purpose() -> None:
    from harness.prompts import builtin_names

    assert set(builtin_names()) == set(PROMPT_SET_PURPOSE)


def test_docs_it_points_to_exist() -> None:
    # the validation error for an unknown field falls back to "see docs/scenarios.md"
    assert DOC.is_file()
    for name in ("gpu-quickstart.md", "soak.md", "reports.md"):
        assert (ROOT / "docs" / name).is_file()


def test_schema_command_prints_the_json_schema_and_the_doc() -> None:
    r = cli("schema")
    assert r.returncode == 0, r.stderr
    assert json.loads(r.stdout) == Scenario.model_json_schema()
    r = cli("schema", "--markdown")
    assert r.returncode == 0 and r.stdout == markdown()


def test_plan_every_scenario() -> None:
    files = sorted(str(p.relative_to(ROOT)) for p in (ROOT / "scenarios").glob("*.yaml"))
    r = cli("plan", *files)
    assert r.returncode == 0, r.stdout + r.stderr
    for f in files:
        assert f"{f}: " in r.stdout, f
        sc = Scenario.model_validate(yaml.safe_load((ROOT / f).read_text()))
        for cfg in sc.runs():
            assert f"\n  {cfg.name} (" in r.stdout, (f, cfg.name)
    assert "MISSING: no such model" in r.stdout  # the GPU recipes' placeholder paths: reported, not fatal
    assert "/models/CHANGE-ME/" in r.stdout and "--port <port>" in r.stdout
    assert r.stdout.count("estimated wall clock") == len(files)


def test_plan_masks_the_api_key_and_says_what_is_not_honoured(tmp_path: Path) -> None:
    p = tmp_path / "s.yaml"
    p.write_text(
        "name: t\nserver: {engine: llamacpp, model: m.gguf, threads: 2, api_key_env: PLAN_TEST_KEY}\n"
        "configurations: [{name: baseline}, {name: ng, algorithm: ngram-map-k}]\n"
        "measurement: {design: sequential, streams: [1, 2], repetitions: 2}\n"
        "slo: {ramp: {max_streams: 4}}\nreport: {memory_budget_mib: 100, fill_check: true}\n"
        "soak: {duration_s: 600, shape: {kind: diurnal, users: 4}}\n"
    )
    r = cli("plan", str(p), env={"PLAN_TEST_KEY": "sekrit-value"})
    assert r.returncode == 0, r.stderr
    assert "sekrit-value" not in r.stdout and "LLAMA_API_KEY=***" in r.stdout
    assert "MISSING: no such model file" in r.stdout
    order = [
        "baseline: start",
        "warm-up",
        "1 stream x 2 repetitions",
        "2 streams x 2 repetitions",
        "ramp:",
        "stop",
        "fill check",
        "ng: start",
        "soak baseline",
        "after the soak",
        "soak ng",
        "estimated wall clock",
    ]
    at = [r.stdout.index(x) for x in order]
    assert at == sorted(at), r.stdout
    p.write_text(p.read_text().replace("engine: llamacpp", "engine: vllm").replace("ngram-map-k", "ngram, k: 3"))
    r = cli("plan", str(p), env={"PLAN_TEST_KEY": "sekrit-value"})
    assert r.returncode == 0, r.stderr
    assert (
        "server.threads: vllm does not honour it" in r.stdout
        and "report.fill_check: vllm does not honour it" in r.stdout
    )


@pytest.mark.parametrize(
    ("text", "words"),
    [("name: t\n", "server"), ("name: t\nserver: {model: m}\nconfigurations: [{name: a, nope: 1}]\n", "nope")],
)
def test_plan_bad_scenario_is_exit_2(tmp_path: Path, text: str, words: str) -> None:
    p = tmp_path / "s.yaml"
    p.write_text(text)
    r = cli("plan", str(p))
    assert r.returncode == 2 and words in r.stderr


def test_plan_attached_starts_nothing_and_looks_for_no_model(tmp_path: Path) -> None:
    p = tmp_path / "s.yaml"
    p.write_text(
        "name: t\nserver: {engine: vllm, model: /nowhere/m, url: 'http://10.0.0.5:8000'}\n"
        "configurations: [{name: eagle, algorithm: draft-eagle3, draft: /nowhere/d, k: 3}]\n"
    )
    r = cli("plan", str(p))
    assert r.returncode == 0, r.stderr
    assert "attached to http://10.0.0.5:8000: nothing is started or stopped" in r.stdout
    assert "$ " not in r.stdout and "MISSING" not in r.stdout
