"""The report of a run the real llama-server made, rebuilt twice, rendered by headless Chromium;
`specsoak verify` on the real engine: greedy baseline vs self-draft, token by token.

Tiny on purpose (short prompts, 8-16 tokens): the point is the pipeline, not the figures.
"""

from __future__ import annotations

import json
import os
import re
import shutil
import subprocess
import sys
from pathlib import Path

import numpy as np
import pandas as pd
import pytest
import yaml
from PIL import Image

from harness.records.files import read_jsonl, read_manifest
from tests.integration.conftest import SMOLLM2

pytestmark = pytest.mark.engine

PROMPTS = [
    {"id": "count", "messages": [{"role": "user", "content": "Count from 1 to 10."}]},
    {"id": "colors", "messages": [{"role": "user", "content": "Name three colors."}]},
]


def _scenario(d: Path) -> Path:
    (d / "prompts.jsonl").write_text("".join(json.dumps(p) + "\n" for p in PROMPTS))
    data = {
        "name": "rtest",
        "server": {"model": SMOLLM2, "ctx_size": 1024, "parallel": 2, "threads": 2, "stop_grace_s": 3},
        "configurations": [
            {"name": "baseline", "algorithm": "none"},
            {"name": "self-draft", "algorithm": "draft-simple", "draft": SMOLLM2, "k": 3},
        ],
        "measurement": {
            "prompts": "prompts.jsonl",
            "max_tokens": 8,
            "streams": [1, 2],
            "requests_per_stream": 1,
            "repetitions": 2,
            "warmup_requests": 0,
        },
        # the ramp passes at every N (1 t/s per stream): 1, 2, 4 and stops at its max_streams
        "slo": {"per_stream_tps_min": 1.0, "ramp": {"max_streams": 4, "requests_per_stream": 1, "max_tokens": 8}},
        # 160 MiB: ~2,400 tokens for the baseline (filled by the check), none for SmolLM2 drafting for itself
        "report": {"memory_budget_mib": 160, "fill_check": True},
    }
    path = d / "rtest.yaml"
    path.write_text(yaml.safe_dump(data, sort_keys=False))
    return path


def _cli(*args: str, timeout: float = 600) -> subprocess.CompletedProcess[str]:
    env = dict(os.environ, COLUMNS="200")
    return subprocess.run(
        [sys.executable, "-m", "harness.cli", *args],
        capture_output=True,
        text=True,
        timeout=timeout,
        env=env,
        check=False,
    )


@pytest.fixture(scope="module")
def real_run(tmp_path_factory: pytest.TempPathFactory) -> Path:
    d = tmp_path_factory.mktemp("report_real")
    p = _cli("run", str(_scenario(d)), "--results", str(d / "results"))
    assert p.returncode == 0, p.stderr[-3000:]
    return next((d / "results").glob("*-rtest"))


def _tables(d: Path) -> dict[str, bytes]:
    return {
        f.name: f.read_bytes() for f in sorted(d.iterdir()) if f.suffix in (".csv", ".parquet", ".md", ".html", ".png")
    }


def test_report_of_a_real_run_rebuilds_identically(real_run: Path) -> None:
    manifest = json.loads((real_run / "manifest.json").read_text())
    bw = manifest["machine"]["memory_bandwidth"]
    assert bw["gb_per_s"] > 0.1 and bw["method"].startswith("numpy copy")
    first = _tables(real_run)
    for name in ("verdict", "memory", "max_streams", "break_even", "explanation", "roofline"):
        assert f"{name}.csv" in first and f"{name}.parquet" in first
    p = _cli("report", str(real_run))
    assert p.returncode == 0, p.stderr
    assert _tables(real_run) == first

    verdict = pd.read_csv(real_run / "verdict.csv").set_index("config")
    assert verdict.loc["self-draft", "speedup_2_reps"] == 2  # two repetitions: an interval
    assert verdict.loc["self-draft", "speedup_2_ci_low"] <= verdict.loc["self-draft", "speedup_2_ci_high"]
    roof = pd.read_csv(real_run / "roofline.csv").iloc[0]
    assert roof["roofline_pct"] > 0 and roof["bytes_per_token_mib"] == pytest.approx(92.1, abs=1)
    mem = pd.read_csv(real_run / "memory.csv").set_index("config")
    assert mem.loc["self-draft", "servable_ctx_total"] < mem.loc["baseline", "servable_ctx_total"]
    ex = pd.read_csv(real_run / "explanation.csv").set_index("config")
    assert (
        ex.loc["self-draft", "expected_tokens_per_step"] > 1
        and ex.loc["self-draft", "step_cost_in_baseline_tokens"] > 0
    )
    ms = pd.read_csv(real_run / "max_streams.csv").set_index("config")
    assert ms.loc["baseline", "slo_source"] == "scenario" and ms.loc["baseline", "slots"] == 2


def test_ramp_and_fill_check_on_the_real_engine(real_run: Path) -> None:
    ramp = list(read_jsonl(real_run / "ramp.jsonl"))
    for cfg in ("baseline", "self-draft"):
        steps = [r for r in ramp if r["config"] == cfg and r["event"] == "step"]
        assert [s["streams"] for s in steps] == [1, 2, 4] and all(s["passed"] for s in steps)
        result = next(r for r in ramp if r["config"] == cfg and r["event"] == "result")
        assert result["max_streams"] == 4 and result["lower_bound"] and result["slots"] == 2
        # every request of a step is in requests.jsonl under its attempt, with phase 'ramp'
        reqs = [r for r in read_jsonl(real_run / "requests.jsonl") if r["phase"] == "ramp" and r["config"] == cfg]
        assert sorted(r["streams"] for r in reqs) == [1, 2, 2, 4, 4, 4, 4]
        assert {r["attempt"] for r in reqs} == {s["attempt"] for s in steps}
    ms = pd.read_csv(real_run / "max_streams.csv").set_index("config")
    assert ms.loc["baseline", "max_streams_source"] == "adaptive ramp" and ms.loc["baseline", "max_streams"] == 4
    assert bool(ms.loc["baseline", "max_streams_is_lower_bound"])

    fills = {f["config"]: f for f in read_jsonl(real_run / "fill_checks.jsonl")}
    base = fills["baseline"]
    assert base["status"] == "ok", base
    computed = base["computed_ctx_total"]
    assert (
        1500 < computed < 3500 and base["started_ctx_total"] == computed // 512 * 512
    )  # whole 256-token blocks per slot
    # the engine took the context asked for, every slot held a prompt to within a few tokens of it
    assert base["engine_ctx_total"] == base["started_ctx_total"] and base["fills_ok"] == base["fills"] == 2
    assert base["engine_ctx_per_slot"] - 20 <= base["min_tokens_filled"] <= base["engine_ctx_per_slot"]
    assert base["overflow_refused"] and "exceed" in base["overflow_answer"]
    assert base["log_total_mib"] <= 160 and base["rss_peak_mib"] > base["log_total_mib"] * 0.8
    assert (real_run / "logs" / "baseline.fill.server.log").is_file()
    # the drafter's weights and KV leave nothing of 160 MiB: not started, said so
    assert fills["self-draft"]["status"] == "too_small" and fills["self-draft"]["computed_ctx_total"] == 0
    mem = pd.read_csv(real_run / "memory.csv").set_index("config")
    assert mem.loc["baseline", "fill_check"] == "ok" and mem.loc["self-draft", "fill_check"] == "too_small"
    md = (real_run / "report.md").read_text()
    assert "Checked: each configuration was started again" in md and "adaptive ramp" in md


def test_html_report_renders_in_headless_chromium(real_run: Path, tmp_path: Path) -> None:
    chromium = shutil.which("chromium")
    assert chromium, "Debian's chromium is not installed: scripts/system-packages.sh installs it"
    page = (real_run / "report.html").read_text()
    imgs = re.findall(r"<img [^>]*>", page)
    assert len(imgs) >= 3 and all('src="data:image/png;base64,' in i for i in imgs)
    # the same page with a probe that records, after load, every image's source scheme and decoded width
    probe = (
        "<script>window.addEventListener('load',()=>{document.body.setAttribute('data-imgs',JSON.stringify("
        "[...document.images].map(i=>[i.src.slice(0,5),i.complete,i.naturalWidth])))});</script></body>"
    )
    (tmp_path / "probe.html").write_text(page.replace("</body>", probe))
    flags = [
        chromium,
        "--headless",
        "--no-sandbox",
        "--disable-gpu",
        "--disable-background-networking",
        "--disable-component-update",
        "--disable-sync",
        "--no-first-run",
        "--hide-scrollbars",
        "--virtual-time-budget=5000",
    ]
    dom = subprocess.run(
        [*flags, f"--user-data-dir={tmp_path / 'profile1'}", "--dump-dom", (tmp_path / "probe.html").as_uri()],
        capture_output=True,
        text=True,
        timeout=180,
        check=False,
    )
    m = re.search(r"data-imgs=\"([^\"]*)\"", dom.stdout)
    assert m, dom.stderr[-2000:]
    seen = json.loads(m.group(1).replace("&quot;", '"'))
    assert len(seen) == len(imgs)
    assert all(scheme == "data:" and complete and width > 0 for scheme, complete, width in seen), seen

    shot = tmp_path / "report.png"
    subprocess.run(
        [
            *flags,
            f"--user-data-dir={tmp_path / 'profile2'}",
            "--window-size=1280,2400",
            f"--screenshot={shot}",
            (real_run / "report.html").as_uri(),
        ],
        capture_output=True,
        text=True,
        timeout=180,
        check=False,
    )
    assert shot.is_file()
    pixels = np.asarray(Image.open(shot).convert("RGB"))
    assert pixels.shape[0] == 2400 and pixels.shape[1] == 1280
    assert len(np.unique(pixels.reshape(-1, 3), axis=0)) > 50  # text, tables and plots: not a blank page
    keep = os.environ.get("SPECSOAK_KEEP_SCREENSHOT")
    if keep:
        shutil.copy(shot, keep)


def test_verify_greedy_self_draft_against_baseline_on_the_real_engine(real_run: Path, tmp_path: Path) -> None:
    scenario = real_run.parent.parent / "rtest.yaml"
    p = _cli(
        "verify",
        str(scenario),
        "--into",
        str(real_run),
        "--prompts",
        "2",
        "--max-tokens",
        "16",
        "--streams",
        "2",
        "--samples",
        "16",
        "--temperature",
        "1.0",
    )
    assert p.returncode in (0, 1), p.stderr[-3000:]  # 1: outputs differ; the report must say so either way
    rows = list(read_jsonl(real_run / "verify.jsonl"))
    spec = [r for r in rows if r["config"] == "self-draft"]
    assert {(r["streams"], r["reference"]) for r in spec} == {(1, "baseline@1"), (2, "baseline@1"), (2, "baseline@2")}
    assert all(r["method"] == "tokens" and r["identical"] is not None for r in spec)
    assert sum(r["draft_tokens"] or 0 for r in spec if r["streams"] == 1) > 0  # speculation really ran
    identical = all(r["identical"] for r in rows)
    assert (p.returncode == 0) == identical
    # the comparison is in the run's manifest, beside the run's own keys
    state = read_manifest(real_run).verify
    assert state is not None and state.status == "completed" and state.all_identical == identical
    assert state.streams == 2 and len(state.prompts) == 2 and state.max_tokens == 16
    for r in spec:
        if not r["identical"]:
            assert isinstance(r["first_diff_token"], int)
    dist = list(read_jsonl(real_run / "verify_distribution.jsonl"))
    assert len(dist) == 1 and dist[0]["samples"] == 16 and dist[0]["temperature"] == 1.0
    assert dist[0]["p_value"] is None or 0 <= dist[0]["p_value"] <= 1
    report = (real_run / "report.md").read_text()
    assert "## Losslessness" in report and ("identical on all" in report or "diverged on" in report)
    verify = pd.read_csv(real_run / "verify.csv")
    assert set(verify["config"]) == {"baseline", "self-draft"}
