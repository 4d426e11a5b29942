"""Reports from the checked-in real run (tests/fixtures/run_quick) and from small hand-written folders."""

from __future__ import annotations

import json
import math
import re
import shutil
import subprocess
import sys
from collections import Counter
from pathlib import Path
from typing import Any

import numpy as np
import pandas as pd
import pytest
import scipy.stats

from harness.common.stats import break_even, expected_tokens_per_step, percentile, t_interval
from harness.load.greedy import Answer
from harness.report.build import TABLES, build_report
from harness.run.verify import chi_square, first_difference

FIXTURE = Path(__file__).resolve().parents[1] / "fixtures" / "run_quick"


@pytest.fixture
def run_dir(tmp_path: Path) -> Path:
    d = tmp_path / "20261129T102500Z-quick"
    shutil.copytree(FIXTURE, d)
    return d


def _files(d: Path) -> dict[str, bytes]:
    return {
        p.name: p.read_bytes() for p in sorted(d.iterdir()) if p.suffix in (".csv", ".parquet", ".png", ".md", ".html")
    }


# ---- statistics ---------------------------------------------------------------------------------
def test_t_interval_matches_the_textbook_and_needs_two_values() -> None:
    lo, hi = t_interval([1.0, 2.0, 3.0])
    # mean 2, s = 1, t(0.975, 2) = 4.302653
    assert lo == pytest.approx(2 - 4.302653 / math.sqrt(3), abs=1e-5) and hi == pytest.approx(
        2 + 4.302653 / math.sqrt(3), abs=1e-5
    )
    assert t_interval([1.5]) == (None, None)
    assert t_interval([]) == (None, None)
    assert t_interval([0.9, 0.9]) == (pytest.approx(0.9), pytest.approx(0.9))


def test_expected_tokens_per_step() -> None:
    assert expected_tokens_per_step(0.0, 3) == 1.0
    assert expected_tokens_per_step(1.0, 3) == 4.0
    assert expected_tokens_per_step(0.5, 3) == pytest.approx(1 + 0.5 + 0.25 + 0.125)
    with pytest.raises(ValueError, match=r"acceptance must be within \[0, 1\]"):
        expected_tokens_per_step(1.2, 3)


def test_break_even_kinds_and_interpolation() -> None:
    be = break_even([(1, 1.4), (4, 0.8), (8, 0.6)])
    assert be["kind"] == "crosses" and be["streams"] == pytest.approx(1 + 0.4 * 3 / 0.6)
    assert be["evidence"] == [(1, 1.4), (4, 0.8)]
    assert break_even([(1, 1.2), (4, 1.1)])["kind"] == "never"
    assert break_even([(1, 0.5), (4, 0.54)])["kind"] == "always"
    assert break_even([(1, 0.86), (4, 1.01)])["kind"] == "mixed"
    assert break_even([])["kind"] == "unknown"
    assert break_even([(4, 1.0), (1, 2.0)])["streams"] == pytest.approx(4.0)  # exactly 1.0 no longer beats it


def test_percentile_is_linear() -> None:
    assert percentile([1, 2, 3, 4], 50) == 2.5
    assert percentile([], 95) is None


def test_verify_answers_that_failed_are_never_counted_identical(tmp_path: Path) -> None:
    """An engine that refuses verify's request (vLLM refused `stream_options` without `stream`) gives no answer to
    compare: the configuration is not identical, and the console says so instead of "2/2 identical"."""
    import io

    from rich.console import Console

    from harness.config.schema import Configuration
    from harness.records.files import JsonlWriter, read_jsonl
    from harness.run.verify import Verifier

    v = object.__new__(Verifier)
    buf = io.StringIO()
    v.console, v.seed, v.max_tokens = Console(file=buf, width=300), 1, 8
    cfg = Configuration(name="eagle3", algorithm="draft-eagle3", draft="e.gguf", k=3)
    ref = [Answer("a", "x", (1,)), Answer("b", "y", (2,))]
    got = [Answer("a", "x", (1,)), Answer("b", error="HTTPError: HTTP Error 400: Bad Request")]
    out = JsonlWriter(tmp_path / "verify.jsonl")
    assert v._compare(out, cfg, 1, got, ref, "baseline@1") is False
    out.close()
    assert "1/2 identical, 1 without an answer to compare" in buf.getvalue() and "HTTP Error 400" in buf.getvalue()
    assert [r["identical"] for r in read_jsonl(tmp_path / "verify.jsonl")] == [True, None]


def test_verify_compares_each_configuration_with_its_own_baseline(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """An MTP target is its own model: its configuration is compared with that model's baseline (`baseline:`), not
    the scenario's first one (vLLM's MiMo-layout SmolLM2 differs from SmolLM2 in its last bits); each baseline's
    engine starts once."""
    import io

    import yaml
    from rich.console import Console

    from harness.config.loader import load_scenario
    from harness.records.files import read_jsonl
    from harness.run.verify import Verifier, VerifyOptions

    (tmp_path / "t.gguf").write_bytes(b"x")
    (tmp_path / "mtp.gguf").write_bytes(b"x")
    data = {
        "name": "v",
        "server": {"engine": "llamacpp", "model": "t.gguf"},
        "configurations": [
            {"name": "baseline", "algorithm": "none"},
            {"name": "ngram", "algorithm": "ngram-map-k"},
            {"name": "mtp-none", "algorithm": "none", "model": "mtp.gguf"},
            {"name": "mtp", "algorithm": "draft-mtp", "model": "mtp.gguf", "baseline": "mtp-none", "k": 1},
        ],
        "measurement": {"prompts": "builtin:repeat", "streams": [1, 2]},
    }
    (tmp_path / "v.yaml").write_text(yaml.safe_dump(data))
    loaded = load_scenario(tmp_path / "v.yaml")
    started: list[str] = []

    def answers(self: Verifier, cfg: Any, run_dir: Path) -> dict[str, Any]:
        started.append(cfg.name)
        word = "mtp-model" if (cfg.model or "").endswith("mtp.gguf") else "target"
        return {
            "answers": {n: [Answer(p.id, f"{word} {p.id}", None) for p in self.prompts] for n in (1, 2)},
            "samples": [],
        }

    monkeypatch.setattr(Verifier, "_answers", answers)
    run_dir, same = Verifier(loaded, tmp_path / "results", VerifyOptions(prompts=2), Console(file=io.StringIO())).run()
    assert same is True and started == ["baseline", "ngram", "mtp-none", "mtp"]
    rows = list(read_jsonl(run_dir / "verify.jsonl"))
    assert {r["reference"] for r in rows if r["config"] == "mtp"} == {"mtp-none@1", "mtp-none@2"}
    assert {r["reference"] for r in rows if r["config"] == "ngram"} == {"baseline@1", "baseline@2"}


def test_verify_sends_no_stream_options_and_asks_vllm_for_token_ids() -> None:
    from engines.llamacpp import LlamaCpp
    from engines.types import LaunchSpec
    from engines.vllm import Vllm

    spec = LaunchSpec(model=Path("/m"), port=1)
    vllm = Vllm(spec, Path("/dev/null"))
    assert "stream_options" in vllm.request_extras()  # streamed requests ask for usage in every chunk
    assert "stream_options" not in vllm.answer_extras() and vllm.answer_extras()["return_token_ids"] is True
    assert "stream_options" not in LlamaCpp(spec, Path("/dev/null")).answer_extras()


def test_first_difference_tokens_and_text() -> None:
    ref = Answer("p", "abc", (1, 2, 3))
    assert first_difference(ref, Answer("p", "abc", (1, 2, 3))) == (True, None, "tokens")
    assert first_difference(ref, Answer("p", "abd", (1, 2, 4))) == (False, 2, "tokens")
    assert first_difference(ref, Answer("p", "ab", (1, 2))) == (False, 2, "tokens")
    assert first_difference(Answer("p", "hello world"), Answer("p", "hello there")) == (False, 6, "text")


def test_chi_square_pools_rare_categories() -> None:
    same = chi_square(Counter({"a": 50, "b": 50}), Counter({"a": 48, "b": 52}))
    assert same["categories"] == 2 and same["p_value"] > 0.5
    diff = chi_square(Counter({"a": 90, "b": 10}), Counter({"a": 10, "b": 90}))
    assert diff["p_value"] < 1e-10
    one = chi_square(Counter({"a": 3, "b": 1}), Counter({"a": 2, "c": 1}))
    assert one["p_value"] is None  # everything pooled into one category: no test


# ---- the report of the real quick run ---------------------------------------------------------------
def test_report_of_the_quick_run_has_every_table_and_rebuilds_identically(run_dir: Path) -> None:
    rep = build_report([run_dir])
    first = _files(run_dir)
    for name in ("verdict", "memory", "max_streams", "break_even", "explanation", "roofline"):
        assert f"{name}.csv" in first and f"{name}.parquet" in first, name
        assert pd.read_parquet(run_dir / f"{name}.parquet").equals(rep.tables[name].reset_index(drop=True)), name
    for absent in ("soak", "verify", "verify_distribution"):  # no soak and no verify in this run: no empty files
        assert f"{absent}.csv" not in first
    assert {"tps_vs_streams.png", "latency.png", "memory.png"} <= set(first)
    build_report([run_dir])
    assert _files(run_dir) == first


def test_verdict_has_per_repetition_confidence_intervals(run_dir: Path) -> None:
    rep = build_report([run_dir])
    v = rep.verdict.set_index("config")
    draft = v.loc["draft-self-k3"]
    assert draft["speedup_4_reps"] == 3
    assert draft["speedup_4_ci_low"] < draft["speedup_4"] < draft["speedup_4_ci_high"] < 1.0
    assert v.loc["baseline", "speedup_4_ci_low"] == pytest.approx(1.0)
    # computed here from phases.jsonl, not copied from the report: repetition r of the configuration over
    # repetition r of the baseline at 4 streams, geometric mean and t interval of the log ratios (docs/metrics.md)
    tps = {
        (p["config"], p["repetition"]): p["total_tps"]
        for p in map(json.loads, (run_dir / "phases.jsonl").read_text().splitlines())
        if p["phase"] == "measure" and p["streams"] == 4
    }
    logs = np.log([tps["draft-self-k3", r] / tps["baseline", r] for r in (1, 2, 3)])
    half = scipy.stats.t.ppf(0.975, len(logs) - 1) * logs.std(ddof=1) / math.sqrt(len(logs))
    centre, low, high = math.exp(logs.mean()), math.exp(logs.mean() - half), math.exp(logs.mean() + half)
    assert (draft["speedup_4"], draft["speedup_4_ci_low"], draft["speedup_4_ci_high"]) == pytest.approx(
        (centre, low, high), rel=1e-9
    )
    assert f"{centre:.2f}× [{low:.2f}, {high:.2f}]" in rep.markdown.read_text()


def test_displayed_verdict_rows_show_the_run_s_figures(run_dir: Path) -> None:
    """The verdict as shown (report.md, terminal): the acceptance columns pooled from phases.jsonl here."""
    rep = build_report([run_dir])
    shown = rep.display.set_index("configuration")
    assert list(shown.index) == ["baseline", "ngram-map-k", "draft-self-k3"]
    assert (shown.loc["baseline", "solo vs baseline [95% CI]"], shown.loc["baseline", "@4 vs baseline [95% CI]"]) == (
        "(baseline)",
        "(baseline)",
    )
    assert shown.loc["draft-self-k3", "algorithm"] == "draft-simple"
    phases = [
        p
        for p in map(json.loads, (run_dir / "phases.jsonl").read_text().splitlines())
        if p["config"] == "draft-self-k3"
    ]
    accepted, drafted, steps = (
        sum(p["counters"][k] for p in phases) for k in ("accepted_tokens", "draft_tokens", "verify_steps")
    )
    assert shown.loc["draft-self-k3", "acceptance"] == f"{accepted / drafted:.2f}"
    assert shown.loc["draft-self-k3", "mean length"] == f"{1 + accepted / steps:.2f}"
    assert shown.loc["baseline", "acceptance"] == "–"
    assert (shown.loc["draft-self-k3", "ctx/slot"], shown.loc["draft-self-k3", "ctx total"]) == (
        "2,048",
        "8,192",
    )  # base_lv4 log lines


def test_memory_table_reads_the_log_figures_and_the_budget(run_dir: Path) -> None:
    rep = build_report([run_dir], memory_budget_mib=1024)
    m = rep.tables["memory"].set_index("config")
    assert m.loc["baseline", "target_kv_kib_per_token"] == pytest.approx(22.5)  # 180 MiB / 8192 tokens
    assert m.loc["draft-self-k3", "draft_kv_kib_per_token"] == pytest.approx(22.5)
    assert m.loc["draft-self-k3", "drafter_weights_mib"] == pytest.approx(92.1)
    assert m.loc["baseline", "servable_ctx_total"] == math.floor((1024 - 92.1 - 16.64) * 1024 / 22.5)
    assert m.loc["draft-self-k3", "servable_ctx_total"] == math.floor((1024 - 2 * 92.1 - 2 * 16.64) * 1024 / 45.0)
    assert m.loc["draft-self-k3", "servable_ctx_per_slot"] == m.loc["draft-self-k3", "servable_ctx_total"] // 4
    assert m.loc["draft-self-k3", "servable_ctx_vs_baseline"] < 0.5
    # without a budget the servable context is not invented
    assert build_report([run_dir]).tables["memory"]["servable_ctx_total"].isna().all()


def test_scenario_budget_and_slo_are_read_from_the_manifest(run_dir: Path) -> None:
    m = json.loads((run_dir / "manifest.json").read_text())
    m["scenario_parsed"]["report"] = {"memory_budget_mib": 512}
    m["scenario_parsed"]["slo"] = {"per_stream_tps_min": 15, "ttft_p95_s_max": None}
    (run_dir / "manifest.json").write_text(json.dumps(m))
    rep = build_report([run_dir])
    assert (rep.tables["memory"]["memory_budget_mib"] == 512).all()
    ms = rep.tables["max_streams"].set_index("config")
    assert ms.loc["baseline", "max_streams"] == 4 and bool(ms.loc["baseline", "max_streams_is_lower_bound"])
    assert ms.loc["draft-self-k3", "max_streams"] == 1  # 11.6 t/s per stream at 4 < 15
    assert "N=4" in ms.loc["draft-self-k3", "first_failing"] and ms.loc["draft-self-k3", "slots"] == 4


def test_break_even_and_explanation_of_the_quick_run(run_dir: Path) -> None:
    rep = build_report([run_dir])
    be = rep.tables["break_even"].set_index("config")
    assert be.loc["draft-self-k3", "break_even_kind"] == "always"
    assert be.loc["ngram-map-k", "break_even_kind"] == "mixed"
    ex = rep.tables["explanation"].set_index("config")
    d = ex.loc["draft-self-k3"]
    assert d["k"] == 3 and d["k_source"] == "scenario"
    assert d["expected_tokens_per_step"] == pytest.approx(expected_tokens_per_step(d["acceptance"], 3))
    assert (
        d["step_cost_in_baseline_tokens"] > d["expected_tokens_per_step"]
    )  # why it loses: a step costs more than it yields
    assert d["predicted_solo_speedup"] == pytest.approx(d["measured_solo_speedup"], rel=0.15)


def test_roofline_needs_the_measured_bandwidth(run_dir: Path) -> None:
    rf = build_report([run_dir]).tables["roofline"]
    assert rf["roofline_pct"].isna().all() and "not measured" in rf["bandwidth_method"].iloc[0]
    m = json.loads((run_dir / "manifest.json").read_text())
    m["machine"]["memory_bandwidth"] = {"method": "numpy copy, best of repeats", "gb_per_s": 10.0}
    (run_dir / "manifest.json").write_text(json.dumps(m))
    rf = build_report([run_dir]).tables["roofline"].iloc[0]
    assert rf["roofline_tps"] == pytest.approx(10e9 / (92.1 * 2**20))
    assert rf["roofline_pct"] == pytest.approx(100 * rf["solo_decode_tps"] / rf["roofline_tps"])


def test_html_is_self_contained(run_dir: Path) -> None:
    rep = build_report([run_dir])
    assert rep.html is not None
    page = rep.html.read_text()
    imgs = re.findall(r"<img [^>]*>", page)
    assert len(imgs) == 4  # throughput, control, latency, memory
    assert all('src="data:image/png;base64,' in i for i in imgs)
    assert not re.search(r'(src|href)="(?!data:)', page)  # nothing fetched from anywhere
    assert "<table" in page and "draft-self-k3" in page


def test_combined_runs_have_a_run_column(run_dir: Path, tmp_path: Path) -> None:
    other = tmp_path / "20261129T110000Z-quick"
    shutil.copytree(FIXTURE, other)
    m = json.loads((other / "manifest.json").read_text())
    m["run_id"] = other.name
    (other / "manifest.json").write_text(json.dumps(m))
    rep = build_report([run_dir, other])
    assert rep.out_dir.name.startswith("combined-")
    assert list(rep.verdict["run"].unique()) == [run_dir.name, other.name]
    assert len(rep.tables["memory"]) == 6 and "run" in rep.display.columns
    assert "engine" not in rep.display.columns  # one engine: the column would say nothing
    first = _files(rep.out_dir)
    build_report([run_dir, other])
    assert _files(rep.out_dir) == first
    # one run per engine (llama.cpp and vLLM on the same box): each row says its engine
    m["engine"] = "vllm"
    (other / "manifest.json").write_text(json.dumps(m))
    both = build_report([run_dir, other], out_dir=tmp_path / "engines")
    assert list(both.display["engine"]) == ["llamacpp"] * 3 + ["vllm"] * 3
    assert "| engine" in both.markdown.read_text()


def _write_jsonl(path: Path, recs: list[dict]) -> None:
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text("".join(json.dumps(r) + "\n" for r in recs))


def test_soak_table_counts_failures_in_soak_time(run_dir: Path) -> None:
    t0 = 1_800_000_000.0
    _write_jsonl(
        run_dir / "soak_slices.jsonl",
        [
            {"event": "start", "slice": "baseline-s001", "config": "baseline", "t_unix": t0},
            {
                "event": "end",
                "slice": "baseline-s001",
                "config": "baseline",
                "t_unix": t0 + 1800,
                "elapsed_s": 1800.0,
                "restarts": 1,
            },
            {"event": "start", "slice": "draft-self-k3-s002", "config": "draft-self-k3", "t_unix": t0 + 1800},
            {
                "event": "end",
                "slice": "draft-self-k3-s002",
                "config": "draft-self-k3",
                "t_unix": t0 + 3600,
                "elapsed_s": 1800.0,
                "restarts": 0,
            },
            {"event": "start", "slice": "baseline-s003", "config": "baseline", "t_unix": t0 + 3600},
            {
                "event": "end",
                "slice": "baseline-s003",
                "config": "baseline",
                "t_unix": t0 + 5400,
                "elapsed_s": 1800.0,
                "restarts": 0,
            },
        ],
    )
    recs = []
    recs.extend(
        {
            "config": "baseline",
            "attempt": "baseline-s001",
            "id": f"a{i}",
            "status": "ok",
            "start_unix_s": t0 + 10 * i,
            "e2e_s": 1.0,
        }
        for i in range(20)
    )
    recs.append(
        {
            "config": "baseline",
            "attempt": "baseline-s003",
            "id": "b1",
            "status": "error",
            "error_kind": "stall",
            "start_unix_s": t0 + 3600 + 100,
            "e2e_s": 60.0,
        }
    )
    recs.append(
        {
            "config": "draft-self-k3",
            "attempt": "draft-self-k3-s002",
            "id": "c1",
            "status": "ok",
            "start_unix_s": t0 + 1900,
            "e2e_s": 1.0,
        }
    )
    _write_jsonl(run_dir / "soak" / "baseline-s001-1.jsonl", recs[:20])
    _write_jsonl(run_dir / "soak" / "baseline-s003-1.jsonl", [recs[20]])
    _write_jsonl(run_dir / "soak" / "draft-self-k3-s002-1.jsonl", [recs[21]])
    _write_jsonl(
        run_dir / "verdicts.jsonl",
        [
            {
                "t_unix": t0 + 600,
                "config": "baseline",
                "slice": "baseline-s001",
                "kind": "crash",
                "metric": None,
                "message": "exit 139",
            },
            {
                "t_unix": t0 + 5000,
                "config": "baseline",
                "slice": "baseline-s003",
                "kind": "drift",
                "metric": "acceptance",
                "message": "acceptance falls 20%",
            },
        ],
    )
    _write_jsonl(
        run_dir / "windows.jsonl",
        [{"config": "baseline", "t_unix": t0 + 60 * i, "acceptance": None, "decode_tps": 60.0 - i} for i in range(5)]
        + [
            {"config": "draft-self-k3", "t_unix": t0 + 1800 + 60 * i, "acceptance": 0.9 - 0.01 * i, "decode_tps": 30.0}
            for i in range(5)
        ],
    )
    rep = build_report([run_dir])
    s = rep.tables["soak"].set_index("config")
    b = s.loc["baseline"]
    assert b["duration_s"] == 3600.0 and b["requests"] == 21 and b["failures"] == 2
    assert json.loads(b["failures_by_kind"]) == {"engine crash": 1, "stall": 1}
    assert b["time_to_first_failure_s"] == 600.0  # the crash, 600 s into its first slice
    assert b["failures_per_hour"] == 2.0 and b["restarts"] == 1
    assert "acceptance" in b["drift"] and b["drift_verdicts"] == 1
    d = s.loc["draft-self-k3"]
    assert d["failures"] == 0 and pd.isna(d["time_to_first_failure_s"]) and d["drift"] == "none"
    assert (run_dir / "acceptance_over_time.png").stat().st_size > 5000 and (run_dir / "soak.csv").is_file()
    first = _files(run_dir)
    build_report([run_dir])
    assert _files(run_dir) == first


def test_verify_results_are_shown_whatever_they_are(run_dir: Path) -> None:
    base = {"algorithm": "draft-simple", "synthetic": False, "method": "tokens", "reference": "baseline@1"}
    _write_jsonl(
        run_dir / "verify.jsonl",
        [
            {
                **base,
                "config": "draft-self-k3",
                "streams": 1,
                "prompt_id": "p1",
                "identical": True,
                "first_diff_token": None,
                "draft_tokens": 9,
            },
            {
                **base,
                "config": "draft-self-k3",
                "streams": 1,
                "prompt_id": "p2",
                "identical": False,
                "first_diff_token": 7,
                "draft_tokens": 9,
            },
            {
                **base,
                "config": "synth",
                "synthetic": True,
                "method": "skipped",
                "streams": 1,
                "prompt_id": "p1",
                "identical": None,
                "first_diff_token": None,
            },
        ],
    )
    _write_jsonl(
        run_dir / "verify_distribution.jsonl",
        [
            {
                "config": "draft-self-k3",
                "temperature": 0.8,
                "samples": 40,
                "categories": 3,
                "statistic": 1.2,
                "dof": 2,
                "p_value": 0.55,
                "verdict": "no difference detected (p = 0.55)",
                "counts": {"baseline": {"1,2": 20}, "config": {"1,2": 19}},
            },
        ],
    )
    rep = build_report([run_dir])
    v = rep.tables["verify"].set_index("config")
    assert v.loc["draft-self-k3", "verdict"] == "diverged on 1 of 2 prompts"
    assert v.loc["draft-self-k3", "earliest_divergence_token"] == 7 and v.loc["draft-self-k3", "divergences"] == "p2@7"
    assert v.loc["synth", "verdict"] == "synthetic: never lossless"
    md = rep.markdown.read_text()
    assert "diverged on 1 of 2 prompts" in md and "p = 0.55" in md
    assert "counts" not in rep.tables["verify_distribution"]


def test_cli_report_rejects_a_folder_that_is_not_a_run(tmp_path: Path) -> None:
    p = subprocess.run(
        [sys.executable, "-m", "harness.cli", "report", str(tmp_path)],
        capture_output=True,
        text=True,
        timeout=120,
        check=False,
    )
    assert p.returncode == 2 and "not a run folder" in p.stderr


def test_every_table_is_named_in_the_docs() -> None:
    docs = (Path(__file__).resolve().parents[2] / "docs" / "metrics.md").read_text()
    for name in TABLES:
        if name != "verdict":
            assert f"`{name}.csv`" in docs or f"`{name}.csv`" in docs.replace(", `verify_distribution.csv`", ""), name


# ---- damaged run folders (a copy of a real `make run` folder, then cut, corrupted, wrong-typed) ------------------
def _cli(*args: str) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        [sys.executable, "-m", "harness.cli", *args],
        capture_output=True,
        text=True,
        timeout=300,
        env={**__import__("os").environ, "COLUMNS": "250"},
        check=False,
    )


def test_a_cut_and_corrupted_requests_file_is_named_and_its_rows_marked(run_dir: Path) -> None:
    req = run_dir / "requests.jsonl"
    req.write_bytes(
        req.read_bytes()[:5000] + b"\x00\x01\xff binary\n" + b'{"config": 3, "phase": "measure", "status": "ok"}\n'
    )
    p = _cli("report", str(run_dir))
    assert p.returncode == 0, p.stderr
    first = next(ln for ln in p.stderr.splitlines() if "could not read" in ln)
    assert (
        "requests.jsonl: 2 lines skipped, the first at line 3" in first
        and "not JSON: 1" in first
        and "field 'config'" in first
    )
    md = (run_dir / "report.md").read_text()
    assert "**Could not read** run 20261129T102500Z-quick: requests.jsonl: 2 lines skipped" in md
    verdict = pd.read_csv(run_dir / "verdict.csv")
    # every phase recorded 30 requests per configuration; the cut file keeps 1 of the baseline's and none of the others'
    assert list(verdict["records_expected"]) == [30, 30, 30]
    assert list(verdict["records_missing"]) == [29, 30, 30]
    assert "request records read" in md and "✗ 1 of 30" in md and "✗ 1 of 30" in p.stdout
    assert "only 1 request records could be read: its row is marked" in md


def test_an_intact_run_folder_reports_nothing_skipped_and_marks_no_row(run_dir: Path) -> None:
    p = _cli("report", str(run_dir))
    assert p.returncode == 0 and "could not read" not in p.stderr
    assert (pd.read_csv(run_dir / "verdict.csv")["records_missing"] == 0).all()
    assert "request records read" not in (run_dir / "report.md").read_text()


def test_wrong_typed_phase_records_and_a_broken_capacity_file_are_named(run_dir: Path) -> None:
    phases = (run_dir / "phases.jsonl").read_text().splitlines()
    bad = json.loads(phases[0])
    bad["total_tps"] = "fast"
    (run_dir / "phases.jsonl").write_text("\n".join([json.dumps(bad), *phases[1:]]) + "\n")
    cap = sorted((run_dir / "capacity").glob("*.json"))[0]
    cap.write_text("{not json")
    p = _cli("report", str(run_dir))
    assert p.returncode == 0, p.stderr
    assert (
        "phases.jsonl: 1 line skipped, the first at line 1 (field 'total_tps' missing or of the wrong type)" in p.stderr
    )
    assert f"capacity/{cap.name}: 1 line skipped" in p.stderr and "unreadable capacity record" in p.stderr


def test_resume_of_a_finished_run_says_so_and_measures_nothing(run_dir: Path) -> None:
    before = (run_dir / "requests.jsonl").read_bytes()
    p = _cli("resume", str(run_dir), "--no-report")
    assert p.returncode == 0 and "already complete (completed); nothing to resume" in " ".join(p.stderr.split())
    assert (run_dir / "requests.jsonl").read_bytes() == before


def test_prompts_table_counts_distinct_prompts_per_phase_and_soak(run_dir: Path) -> None:
    phases = [json.loads(line) for line in (run_dir / "phases.jsonl").read_text().splitlines() if line.strip()]
    for i, ph in enumerate(phases):
        ph["distinct_prompts"] = ph["requests"] - (1 if i == 0 else 0)  # the first phase sent one prompt twice
    _write_jsonl(run_dir / "phases.jsonl", phases)
    t0 = 1_800_000_000.0
    recs = [
        {
            "config": "baseline",
            "attempt": "baseline-s001",
            "id": f"a{i}",
            "status": "ok",
            "start_unix_s": t0 + i,
            "e2e_s": 1.0,
            "prompt_id": f"p{i % 3}",
            "turn": i % 2,
        }
        for i in range(10)
    ]  # 3 ids, each at turns 0 and 1: 6 distinct
    _write_jsonl(run_dir / "soak" / "baseline-s001-1.jsonl", recs)
    rep = build_report([run_dir])
    pt = rep.tables["prompts"]
    soak = pt[pt["phase"] == "soak"].iloc[0]
    assert (soak["config"], soak["requests"], soak["distinct_prompts"], soak["repeated"]) == ("baseline", 10, 6, 4)
    measured = pt[pt["phase"] != "soak"]
    assert len(measured) == len(phases) and measured["repeated"].tolist() == [1] + [0] * (len(phases) - 1)
    md = (run_dir / "report.md").read_text()
    assert "## Prompts" in md and "distinct prompts" in md


def test_break_even_says_why_solo_decode_and_one_stream_disagree() -> None:
    from harness.report.tables.speculation import _solo_vs_n1

    # the README's f32-draft-q4: faster solo by decode rate, slower at one stream by total t/s
    note = _solo_vs_n1(1.09, 0.93)
    assert "1.09×" in note and "0.93×" in note and "prompt processing" in note
    assert _solo_vs_n1(0.49, 0.48) == "" and _solo_vs_n1(None, 0.9) == ""
