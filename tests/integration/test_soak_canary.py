"""The output canary on the real llama-server: a canary answer corrupted between harness and engine (the fault proxy)
after the speculative configuration's second round is a `divergence` verdict that stops it, exit code 4, with the
prompt, the first differing token and both texts as evidence; the same soak unplanted gives no verdict, and the
speculative configuration's answers equal its first ones and the baseline's (the floor measured in docs/soak.md)."""

from __future__ import annotations

import json
import os
import signal
import threading
from pathlib import Path
from typing import Any

import pytest
import yaml

from harness.common.net import free_port
from harness.records.files import read_jsonl
from harness.soak.canary import CANARY
from tests.faults.helpers import finish, start_cli
from tests.faults.proxy import CORRUPT_FROM, FaultProxy
from tests.integration.conftest import SMOLLM2

pytestmark = pytest.mark.engine
PROMPTS = ["Count from 1 to 20, separated by commas.", "Name three colours and one thing of each colour."]
SOAK_S = 30  # unplanted: each configuration's soak
PLANTED_SOAK_S = 150  # planted: the n-gram configuration alone, stopped by the verdict long before this


def _scenario(tmp_path: Path, engine_port: int, proxy_url: str, plant: bool) -> Path:
    data = {
        "name": "canary",
        "server": {
            "model": SMOLLM2,
            "ctx_size": 2048,
            "parallel": 2,
            "threads": 2,
            "stop_grace_s": 3,
            "port": engine_port,
            "request_base_url": proxy_url,
        },
        "configurations": [{"name": "baseline", "algorithm": "none"}, {"name": "ngram", "algorithm": "ngram-map-k"}],
        "measurement": {
            "prompts": "builtin:repeat",
            "max_tokens": 8,
            "streams": [1],
            "requests_per_stream": 1,
            "repetitions": 1,
            "warmup_requests": 0,
        },
        "soak": {
            "duration_s": PLANTED_SOAK_S if plant else SOAK_S,
            "configurations": ["ngram"] if plant else None,
            "shape": {"kind": "steady", "users": 2},
            "max_tokens": 16,
            "stall_s": 20,
            "canary": {"every_s": 4, "max_tokens": 24, "prompts": PROMPTS},
            # this test is about answers: a window series on 5-s windows of two users is not judged by it
            "watchdog": {"probe_interval_s": 0.5, "hang_s": 20, "window_s": 5, "actions": {"collapse": "record"}},
        },
    }
    path = tmp_path / "canary.yaml"
    path.write_text(yaml.safe_dump(data, sort_keys=False))
    return path


def _rounds(run_dir: Path | None, config: str) -> int:
    if run_dir is None:
        return 0
    return len({(r["slice"], r["round"]) for r in read_jsonl(run_dir / CANARY) if r.get("config") == config})


def _run(tmp_path: Path, plant: bool) -> tuple[int, str, Path, FaultProxy]:
    """`specsoak run` through the fault proxy; with ``plant``, every whole answer is corrupted once the ngram configuration
    has answered two canary rounds."""
    results = tmp_path / "results"
    engine_port = free_port()
    with FaultProxy(f"http://127.0.0.1:{engine_port}") as proxy:
        proc = start_cli("run", str(_scenario(tmp_path, engine_port, proxy.url, plant)), "--results", str(results))
        stop = threading.Event()

        def planter() -> None:
            while not stop.wait(0.2):
                dirs = list(results.glob("*-canary")) if results.exists() else []
                if _rounds(dirs[0] if dirs else None, "ngram") >= 2:
                    proxy.corrupt_answers = True
                    return

        t = threading.Thread(target=planter, daemon=True)
        if plant:
            t.start()
        try:
            out = finish(proc, 400)
        finally:
            stop.set()
            if proc.poll() is None:
                os.killpg(proc.pid, signal.SIGKILL)
        return proc.returncode, out, next(results.glob("*-canary")), proxy


def test_a_corrupted_canary_answer_is_a_divergence_that_stops_the_configuration(tmp_path: Path) -> None:
    rc, out, run_dir, proxy = _run(tmp_path, plant=True)
    assert rc == 4, out[-4000:]
    assert proxy.corrupted >= 2
    verdicts = list(read_jsonl(run_dir / "verdicts.jsonl"))
    div = [v for v in verdicts if v["kind"] == "divergence"]
    assert len(div) == 1 and div[0]["config"] == "ngram" and div[0]["action"] == "stop_config", verdicts
    ev = div[0]["evidence"]
    assert ev["prompt_id"] in ("canary-0", "canary-1") and ev["first_diff"] == CORRUPT_FROM and ev["method"] == "tokens"
    assert ev["text"].endswith("corrupted answer") and ev["ref_text"] and ev["ref_text"] != ev["text"]
    # both prompts corrupted in one round (more than max_differing), or the second corrupted round of a prompt
    assert ev["rounds"] == 2 or len(ev["differing"]) == 2, ev
    assert div[0]["engine_uptime_s"] > 0
    recs = [r for r in read_jsonl(run_dir / CANARY) if r["config"] == "ngram"]
    # the rounds before the plant equal the first answers; the one that gave the verdict differs at the corrupted token
    by_round: dict[int, list[dict[str, Any]]] = {}
    for r in recs:
        by_round.setdefault(r["round"], []).append(r)
    assert all(r["vs_first"]["identical"] for r in by_round[2])
    assert all(
        not r["vs_first"]["identical"] and r["vs_first"]["first_diff"] == CORRUPT_FROM for r in by_round[max(by_round)]
    )
    manifest = json.loads((run_dir / "manifest.json").read_text())
    soak = manifest["configurations"]["ngram"]["soak"]
    assert soak["status"] == "failed" and soak["first_failure"]["kind"] == "divergence"
    ends = [e for e in read_jsonl(run_dir / "soak_slices.jsonl") if e["event"] == "end" and e["config"] == "ngram"]
    assert ends and ends[0]["elapsed_s"] < PLANTED_SOAK_S - 30 and ends[0]["stopped_by"].startswith("divergence")
    report = (run_dir / "report.md").read_text()
    assert f"✗ divergence: {ev['prompt_id']} vs its first answer at token {CORRUPT_FROM}" in report


def test_the_same_soak_unplanted_gives_no_divergence(tmp_path: Path) -> None:
    rc, out, run_dir, proxy = _run(tmp_path, plant=False)
    assert rc == 0, out[-4000:]
    assert proxy.corrupted == 0
    assert not [v for v in read_jsonl(run_dir / "verdicts.jsonl") if v["kind"] == "divergence"]
    recs = list(read_jsonl(run_dir / CANARY))
    assert _rounds(run_dir, "baseline") >= 2 and _rounds(run_dir, "ngram") >= 2
    assert all(r["status"] == "ok" and r["tokens"] for r in recs)
    spec = [r for r in recs if r["config"] == "ngram"]
    # llama.cpp Q4_1 on this CPU: the floor is zero (docs/soak.md#output-canary), so every answer equals both references
    assert all(r["vs_baseline"] and r["vs_baseline"]["identical"] for r in spec)
    assert all(r["vs_first"]["identical"] for r in spec if r["vs_first"])
    assert "✓, 0/" in (run_dir / "report.md").read_text()
