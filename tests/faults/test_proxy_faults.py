"""Request faults between the harness and the real llama-server: each one a failed record with its kind."""

from __future__ import annotations

import asyncio
import json
import time
from collections.abc import Iterator
from pathlib import Path

import pytest
import yaml

from engines.llamacpp import LlamaCpp
from engines.types import LaunchSpec
from harness.common.net import free_port
from harness.load.client import ERROR_KINDS, RequestParams, run_streams
from harness.prompts import Prompt
from harness.records.files import read_jsonl
from tests.faults.ledger import FaultLog
from tests.faults.proxy import FAULTS, FaultProxy, expected_kind
from tests.integration.conftest import SMOLLM2, start
from tests.integration.test_llamacpp_real import _cli

pytestmark = pytest.mark.engine
REPO = Path(__file__).parents[2]
MAX_TOKENS = 16
# a short prompt: on 2 shared cores a long one can take seconds of prompt processing before its first chunk
SHORT = [Prompt("short", [{"role": "user", "content": "Count from one to twenty."}])]
SHORT_JSONL = '{"id": "short", "messages": [{"role": "user", "content": "Count from one to twenty."}]}\n'
SCHEDULE = [f for f in FAULTS if f != "pass"] + ["pass"]  # every fault, then a clean request: the run goes on
# the client's stall limit and the run's request timeout: the stall faults wait them out (twice per test); an engine
# alone answers these 16 tokens in under a second even on a slow VM, so 8 s is margin, not 20 s of waiting
STALL_S = 8.0


@pytest.fixture(scope="module")
def engine(smollm2: Path, llama_server_bin: Path, tmp_path_factory: pytest.TempPathFactory) -> Iterator[LlamaCpp]:
    spec = LaunchSpec(model=smollm2, ctx_size=1024, parallel=2, threads=2, port=free_port())
    eng = start(spec, tmp_path_factory.mktemp("proxy-engine") / "server.log")
    yield eng
    eng.stop(5)


def _how(fault: str) -> str:
    return f"fault proxy `{fault}` (tests/faults/proxy.py)"


def test_each_proxy_fault_is_a_failed_record_of_its_kind_through_run_streams(
    engine: LlamaCpp, fault_log: FaultLog
) -> None:
    rows = {
        f: fault_log.inject(
            "request",
            f"{f} (client)",
            _how(f),
            f"record error_kind={expected_kind(f)}" if expected_kind(f) else "ok record, TTFT includes the delay",
        )
        for f in SCHEDULE
        if f != "pass"
    }
    prompts = SHORT
    params = RequestParams(max_tokens=MAX_TOKENS, stall_s=STALL_S, timeout_s=120.0)
    seen = []
    with FaultProxy(engine.base_url, SCHEDULE, slow_s=60.0) as proxy:
        via_proxy = LlamaCpp(
            LaunchSpec(model=engine.spec.model, port=engine.spec.port, request_base_url=proxy.url), engine.log_path
        )
        t0 = time.perf_counter()
        records = asyncio.run(
            run_streams(
                via_proxy,
                prompts,
                params,
                1,
                len(SCHEDULE),
                {"config": "p", "phase": "measure", "streams": 1, "repetition": 1},
                seen.append,
                (time.time(), time.perf_counter_ns()),
            )
        )
        wall = time.perf_counter() - t0
        applied = list(proxy.seen)
    assert applied == SCHEDULE
    assert len(records) == len(seen) == len(SCHEDULE)
    by_fault = dict(zip(SCHEDULE, sorted(records, key=lambda r: r.index), strict=True))
    for fault, rec in by_fault.items():
        want = expected_kind(fault)
        assert rec.error_kind == want, (fault, rec.error_kind, rec.error)
        assert rec.error_kind is None or rec.error_kind in ERROR_KINDS
        if want is None:
            assert rec.status == "ok" and rec.output_tokens == MAX_TOKENS == rec.chunks, (fault, rec)
        else:
            assert rec.status == "error" and rec.e2e_tps is None and rec.error, (fault, rec)
    assert by_fault["slow_headers_ok"].ttft_s >= 1.0  # a slow success, never a fast one
    assert by_fault["stall"].e2e_s >= STALL_S and by_fault["slow_headers"].e2e_s >= STALL_S
    assert by_fault["duplicate"].chunks == MAX_TOKENS + 1
    assert by_fault["truncate"].chunks == by_fault["reset_mid"].chunks == 3
    assert wall < 400 and engine.alive()
    for fault, row in rows.items():
        rec = by_fault[fault]
        row.done(
            f"{rec.status}, error_kind={rec.error_kind}" + (f", TTFT {rec.ttft_s:.2f} s" if rec.status == "ok" else ""),
            samples_lost=len(SCHEDULE) - len(records),
        )


def test_each_proxy_fault_is_a_failed_record_of_its_kind_in_a_real_run(
    tmp_path: Path, engine: LlamaCpp, fault_log: FaultLog
) -> None:
    """`specsoak run` with requests sent through the proxy (server.request_base_url): faults are data, the run completes."""
    faults = [f for f in SCHEDULE if f != "slow_headers_ok"]
    rows = {
        f: fault_log.inject(
            "request",
            f"{f} (specsoak run)",
            _how(f) + " via `server.request_base_url`",
            f"record error_kind={expected_kind(f, stall_is_timeout=True)}, run completes",
        )
        for f in faults
        if f != "pass"
    }
    engine_port = free_port()
    with FaultProxy(f"http://127.0.0.1:{engine_port}", faults, slow_s=60.0) as proxy:
        data = {
            "name": "faults",
            "server": {
                "model": SMOLLM2,
                "ctx_size": 1024,
                "parallel": 2,
                "threads": 2,
                "stop_grace_s": 3,
                "port": engine_port,
                "request_base_url": proxy.url,
                "request_timeout_s": STALL_S,
            },
            "configurations": [{"name": "baseline", "algorithm": "none"}],
            "measurement": {
                "prompts": "short.jsonl",
                "max_tokens": MAX_TOKENS,
                "streams": [1],
                "requests_per_stream": len(faults),
                "repetitions": 1,
                "warmup_requests": 0,
            },
        }
        (tmp_path / "short.jsonl").write_text(SHORT_JSONL)
        scenario = tmp_path / "faults.yaml"
        scenario.write_text(yaml.safe_dump(data, sort_keys=False))
        p = _cli("run", str(scenario), "--results", str(tmp_path / "results"), "--no-report", timeout=300)
        applied = list(proxy.seen)
    assert p.returncode == 0, p.stderr[-3000:]
    assert "Traceback" not in p.stderr
    assert applied == faults
    (run_dir,) = list((tmp_path / "results").glob("*-faults"))
    manifest = json.loads((run_dir / "manifest.json").read_text())
    assert manifest["status"] == "completed"
    records = sorted(read_jsonl(run_dir / "requests.jsonl"), key=lambda r: r["index"])
    lines = (run_dir / "requests.jsonl").read_text().splitlines()
    assert len(records) == len(lines) == len(faults)
    for fault, rec in zip(faults, records, strict=True):
        assert rec["error_kind"] == expected_kind(fault, stall_is_timeout=True), (fault, rec["error"])
    (phase,) = list(read_jsonl(run_dir / "phases.jsonl"))
    assert phase["requests"] == len(faults) and phase["errors"] == len(faults) - 1 and phase["ok"] == 1
    assert phase["output_tokens"] == MAX_TOKENS  # only the clean request's tokens count: no duplicate, no partial
    first = True
    for fault, rec in zip(faults, records, strict=True):
        if fault in rows:
            # the one run completed counts once
            rows[fault].done(
                f"{rec['status']}, error_kind={rec['error_kind']}; run completed, exit 0",
                runs_completed=int(first),
                samples_lost=len(faults) - len(records),
            )
            first = False
