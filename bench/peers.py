"""Peer clients, run from their own virtual environment (.venv-bench, never the project's).

Each peer is driven through its own command line with the closest settings to the harness's
(closed-loop concurrency N, a fixed request count, streaming chat completions, fixed output
length) and its own per-request export is read back for TTFT and ITL. Peers that need a
tokenizer get a tiny local one (bench/tokenizer.py) so nothing is fetched from a hub.
"""

from __future__ import annotations

import json
import shutil
from collections.abc import Callable
from pathlib import Path
from typing import Any

import numpy as np

from bench.measure import REPO, Level, Result, measure, quantile_errors

PEER_VENV = REPO / ".venv-bench"


def _bin(name: str) -> Path:
    return PEER_VENV / "bin" / name


def unavailable(client: str) -> str | None:
    """Why a peer cannot run here, or None."""
    if client == "guidellm" and not _bin("guidellm").exists():
        return f"GuideLLM is not installed in {PEER_VENV} (`make bench` installs it)"
    if client == "aiperf" and not _bin("aiperf").exists():
        return f"AIPerf is not installed in {PEER_VENV} (`make bench` installs it)"
    if client == "vllm":
        found = [p for p in (_bin("vllm"), Path(shutil.which("vllm") or "/nonexistent")) if p.exists()]
        if not found:
            return "vLLM is not installed on this machine (`vllm bench serve` runs where vLLM is installed: a `vllm` on PATH or in the peers' venv)"
    return None


TOKENIZER = Path("/tmp/specsoak-bench/tokenizer")


def _tokenizer() -> Path:
    if not (TOKENIZER / "tokenizer.json").exists():
        import subprocess

        subprocess.run(
            [str(_bin("python")), str(REPO / "bench" / "tokenizer.py"), str(TOKENIZER)], check=True, capture_output=True
        )
    return TOKENIZER


def guidellm_command(profile: dict[str, Any], level: Level, work: Path, out: Path) -> Callable[[str], list[str]]:
    """The GuideLLM 0.8 command for a server URL: ``guidellm run -c scenario.json`` with ``profile`` (concurrent
    streams, or a constant rate), synthetic 16-token prompts, ``level``'s answer length and request count, JSON to ``out``."""
    tok = _tokenizer()

    def cmd(url: str) -> list[str]:
        scenario = {
            "spec": {
                "backend": {
                    "kind": "openai_http",
                    "target": url,
                    "model": "fake-model",
                    "request_format": "/v1/chat/completions",
                },
                "profile": profile,
                "data": [{"kind": "synthetic_text", "prompt_tokens": 16, "output_tokens": level.max_tokens}],
                "tokenizer": {"kind": "huggingface_auto", "model": str(tok)},
                "constraints": [{"kind": "max_requests", "count": level.requests}],
                "outputs": [{"kind": "json", "path": str(out)}],
            }
        }
        path = work / "scenario.json"
        path.write_text(json.dumps(scenario, indent=1))
        return [str(_bin("guidellm")), "run", "-c", str(path), "--disable-console-interactive"]

    return cmd


def run_guidellm(level: Level, work: Path) -> Result:
    """GuideLLM 0.8: ``guidellm run -c scenario.json``, concurrent profile, max_requests constraint."""
    out = work / "guidellm.json"
    cmd = guidellm_command({"kind": "concurrent", "streams": level.streams}, level, work, out)

    res, slog = measure(
        "GuideLLM 0.8.1", level, work, cmd, timeout_s=level.expected_s * 3 + 120, env={"HF_HUB_OFFLINE": "1"}
    )
    if out.exists() and slog is not None:
        reqs = json.loads(out.read_text())["benchmarks"][0]["requests"]
        ok = reqs.get("successful") or []
        res.failed = len(reqs.get("errored") or []) + len(reqs.get("incomplete") or [])
        quantile_errors(
            res,
            slog,
            _ms(r.get("time_to_first_token_ms") for r in ok),
            _ms(r.get("inter_token_latency_ms") for r in ok),
            "per-request average (GuideLLM exports no per-chunk times)",
        )
    return res


def aiperf_command(load: list[str], level: Level, art: Path) -> Callable[[str], list[str]]:
    """The AIPerf 0.13 command for a server URL: ``aiperf profile`` with ``load`` (``--concurrency N``, or a request
    rate and arrival pattern), synthetic 16-token prompts, ``level``'s answer length and request count, server token
    counts (no tokenizing), artifacts in ``art``."""
    tok = _tokenizer()

    def cmd(url: str) -> list[str]:
        return [
            str(_bin("aiperf")),
            "profile",
            "--model",
            "fake-model",
            "--url",
            url,
            "--endpoint-type",
            "chat",
            "--streaming",
            *load,
            "--request-count",
            str(level.requests),
            "--synthetic-input-tokens-mean",
            "16",
            "--output-tokens-mean",
            str(level.max_tokens),
            "--output-tokens-stddev",
            "0",
            "--extra-inputs",
            "ignore_eos:true",
            "--use-server-token-count",
            "--tokenizer",
            str(tok),
            "--artifact-dir",
            str(art),
            "--ui-type",
            "none",
            "--no-server-metrics",
            "--no-gpu-telemetry",
        ]

    return cmd


def run_aiperf(level: Level, work: Path) -> Result:
    """AIPerf 0.13: ``aiperf profile``, concurrency N, request count, server token counts (no tokenizing)."""
    art = work / "artifacts"
    cmd = aiperf_command(["--concurrency", str(level.streams)], level, art)
    res, slog = measure("AIPerf 0.13.0", level, work, cmd, timeout_s=level.expected_s * 3 + 150)
    export = art / "profile_export.jsonl"
    if export.exists() and slog is not None:
        recs = [json.loads(line) for line in export.read_text().splitlines() if line.strip()]
        prof = [r for r in recs if (r.get("metadata") or {}).get("benchmark_phase", "profiling") == "profiling"]
        ok = [r for r in prof if not r.get("error")]
        res.failed = len(prof) - len(ok)

        def metric(r: dict[str, Any], name: str) -> Any:
            return ((r.get("metrics") or {}).get(name) or {}).get("value")

        chunks = [x for r in ok for x in (metric(r, "inter_chunk_latency") or [])]
        quantile_errors(
            res,
            slog,
            _ms(metric(r, "time_to_first_token") for r in ok),
            _ms(chunks),
            "per chunk (inter_chunk_latency export; AIPerf's headline ITL is a per-request average)",
        )
        res.extra["headline_itl_p99_ms"] = (
            float(np.percentile(_ms(metric(r, "inter_token_latency") for r in ok), 99)) if ok else None
        )
    return res


def run_vllm(level: Level, work: Path) -> Result:
    """``vllm bench serve`` where vLLM is installed (random dataset, max concurrency N, ignore EOS)."""
    out = work / "vllm.json"
    tok = _tokenizer()
    exe = _bin("vllm") if _bin("vllm").exists() else Path(shutil.which("vllm") or "vllm")

    def cmd(url: str) -> list[str]:
        return [
            str(exe),
            "bench",
            "serve",
            "--backend",
            "openai-chat",
            "--base-url",
            url,
            "--endpoint",
            "/v1/chat/completions",
            "--model",
            "fake-model",
            "--tokenizer",
            str(tok),
            "--dataset-name",
            "random",
            "--random-input-len",
            "16",
            "--random-output-len",
            str(level.max_tokens),
            "--num-prompts",
            str(level.requests),
            "--max-concurrency",
            str(level.streams),
            "--ignore-eos",
            "--save-result",
            "--save-detailed",
            "--result-dir",
            str(work),
            "--result-filename",
            out.name,
        ]

    res, slog = measure("vllm bench serve", level, work, cmd, timeout_s=level.expected_s * 3 + 150)
    if out.exists() and slog is not None:
        d = json.loads(out.read_text())
        res.failed = int(d.get("failed", 0) or 0)
        quantile_errors(
            res,
            slog,
            _ms(x * 1e3 for x in d.get("ttfts", [])),
            _ms(x * 1e3 for r in d.get("itls", []) for x in r),
            "per chunk",
        )
    return res


def _ms(values: Any) -> np.ndarray:
    return np.array([float(v) for v in values if v is not None], dtype=float)
