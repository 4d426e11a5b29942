"""A slow disk is not the engine's throughput: a phase's clocks stop when its last response ends, before
its records are written (issue: total t/s @N once included the fsync of the phase's records)."""

from __future__ import annotations

import os
import time
from pathlib import Path

import pytest
import yaml

from harness.config.loader import load_scenario
from harness.records.files import PHASES, REQUESTS, read_jsonl
from harness.run.runner import Runner
from tests.integration.conftest import SMOLLM2

pytestmark = pytest.mark.engine
FSYNC_DELAY_S = 1.0


def test_a_slow_fsync_stays_out_of_the_phase_wall_clock(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, llama_server_bin: Path
) -> None:
    data = {
        "name": "slowdisk",
        "server": {"model": SMOLLM2, "ctx_size": 1024, "parallel": 1, "threads": 2, "stop_grace_s": 3},
        "configurations": [{"name": "baseline", "algorithm": "none"}],
        "measurement": {
            "prompts": "builtin:repeat",
            "max_tokens": 16,
            "streams": [1],
            "requests_per_stream": 3,
            "repetitions": 1,
            "warmup_requests": 0,
        },
    }
    (tmp_path / "s.yaml").write_text(yaml.safe_dump(data))
    real_fsync = os.fsync
    calls: list[float] = []

    def slow_fsync(fd: int) -> None:  # a disk that takes a second to make anything durable
        calls.append(time.time())
        time.sleep(FSYNC_DELAY_S)
        real_fsync(fd)

    monkeypatch.setattr(os, "fsync", slow_fsync)
    result = Runner(load_scenario(tmp_path / "s.yaml"), tmp_path / "results").run()
    monkeypatch.setattr(os, "fsync", real_fsync)
    (phase,) = list(read_jsonl(result.run_dir / PHASES))
    records = [r for r in read_jsonl(result.run_dir / REQUESTS) if r["attempt"] == phase["attempt"]]
    assert len(records) == 3 and all(r["status"] == "ok" for r in records)
    last_end = max(r["start_unix_s"] + r["e2e_s"] for r in records)
    assert calls, "the slow fsync was never called"
    # the phase ended with its last response, not a second later when its records were durable
    assert phase["end_unix_s"] - last_end < 0.2, phase["end_unix_s"] - last_end
    assert phase["wall_s"] < last_end - phase["start_unix_s"] + 0.2
    assert phase["total_tps"] == pytest.approx(phase["output_tokens"] / phase["wall_s"])


class _SecondClient:
    """An observer that, half a second after the engine starts, sends it one request of its own: a second
    client using the engine while a phase is measured."""

    def __init__(self) -> None:
        self.sent: list[int] = []

    def __getattr__(self, name: str):
        if name.startswith("on_"):
            return lambda *a, **k: None
        raise AttributeError(name)

    def on_config_start(
        self, config: str, algorithm: str, synthetic: bool, engine: str, engine_url: str, engine_pid: int | None
    ) -> None:
        import json
        import threading
        import urllib.request

        def send() -> None:
            body = json.dumps(
                {"messages": [{"role": "user", "content": "Say something long."}], "max_tokens": 24, "ignore_eos": True}
            ).encode()
            deadline = time.monotonic() + 60
            while time.monotonic() < deadline:  # until the engine has loaded (503 before), then once
                time.sleep(0.5)
                req = urllib.request.Request(
                    engine_url + "/v1/chat/completions", body, {"Content-Type": "application/json"}
                )
                try:
                    with urllib.request.urlopen(req, timeout=60) as r:
                        self.sent.append(json.loads(r.read())["usage"]["completion_tokens"])
                        return
                except OSError:
                    continue

        threading.Thread(target=send, daemon=True).start()


def test_the_agreement_column_goes_red_when_a_second_client_uses_the_engine(
    tmp_path: Path, llama_server_bin: Path
) -> None:
    from harness.report.build import build_report

    data = {
        "name": "agree",
        "server": {"model": SMOLLM2, "ctx_size": 2048, "parallel": 2, "threads": 2, "stop_grace_s": 3},
        "configurations": [{"name": "baseline", "algorithm": "none"}],
        "measurement": {
            "prompts": "builtin:repeat",
            "max_tokens": 32,
            "streams": [1],
            "requests_per_stream": 8,
            "repetitions": 1,
            "warmup_requests": 0,
        },
    }
    (tmp_path / "a.yaml").write_text(yaml.safe_dump(data))
    intruder = _SecondClient()
    result = Runner(load_scenario(tmp_path / "a.yaml"), tmp_path / "results", observers=[intruder]).run()
    assert intruder.sent == [24], "the second client's request did not complete"
    (phase,) = list(read_jsonl(result.run_dir / PHASES))
    assert phase["counters"]["output_tokens"] == phase["output_tokens"] + 24  # the engine counted the intruder's tokens
    row = build_report([result.run_dir]).verdict.iloc[0]
    assert (
        row["engine_agreement"]
        == f"✗ output: engine {phase['output_tokens'] + 24:,} vs client {phase['output_tokens']:,} (another client used the engine?)"
    )


def test_the_agreement_column_is_green_when_the_client_is_alone(tmp_path: Path, llama_server_bin: Path) -> None:
    from harness.report.build import build_report

    data = {
        "name": "alone",
        "server": {"model": SMOLLM2, "ctx_size": 2048, "parallel": 2, "threads": 2, "stop_grace_s": 3},
        "configurations": [{"name": "self-draft", "algorithm": "draft-simple", "draft": SMOLLM2, "k": 2}],
        "measurement": {
            "prompts": "builtin:repeat",
            "max_tokens": 24,
            "streams": [1, 2],
            "requests_per_stream": 2,
            "repetitions": 1,
            "warmup_requests": 0,
        },
    }
    (tmp_path / "b.yaml").write_text(yaml.safe_dump(data))
    result = Runner(load_scenario(tmp_path / "b.yaml"), tmp_path / "results").run()
    row = build_report([result.run_dir]).verdict.iloc[0]
    assert row["engine_agreement"] == "✓", row["engine_agreement"]  # output, drafted and accepted tokens all agree
