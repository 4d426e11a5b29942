"""What real engines do after hours, on the real llama-server (issue #24's shapes, compressed into minutes; the
growing pauses are planted in tests/integration/test_soak_gauntlet.py):

- memory that grows by design (llama.cpp #25740: the host prompt cache grows by one prompt's KV per distinct
  request, up to ``--cache-ram``): with distinct prompts, a cap that fits is reported as cache growth and gives no
  verdict; the default 8 GiB cap under a memory limit it does not fit is a ``cache_cap`` warning and a ``memory``
  verdict, exit code 4.
"""

from __future__ import annotations

import json
import os
from pathlib import Path
from typing import Any

import pytest
import yaml

from harness.records.files import VERDICTS, WINDOWS, read_jsonl
from tests.faults.helpers import finish, start_cli
from tests.integration.conftest import SMOLLM2

pytestmark = pytest.mark.engine

EXIT_SOAK = 4


def _write(folder: Path, data: dict[str, Any]) -> Path:
    path = folder / f"{data['name']}.yaml"
    path.write_text(yaml.safe_dump(data, sort_keys=False))
    return path


def _measurement(contamination_cores: float = 0.05) -> dict[str, Any]:
    """One short measurement before the soak. A developer's machine busy with other work can raise the contamination
    bound for a local run (SPECSOAK_TEST_CONTAMINATION_CORES); CI leaves ``contamination_cores``."""
    return {
        "prompts": "builtin:repeat",
        "max_tokens": 8,
        "streams": [1],
        "requests_per_stream": 1,
        "repetitions": 1,
        "warmup_requests": 0,
        "contamination_cores": float(os.environ.get("SPECSOAK_TEST_CONTAMINATION_CORES", str(contamination_cores))),
    }


def _cache_scenario(folder: Path) -> Path:
    return _write(
        folder,
        {
            "name": "cache",
            # one slot for two users: llama-server saves a slot's prompt into its cache when another prompt takes
            # the slot, so every request adds one (with a slot each, a 20-s long conversation kept its slot and the
            # cache did not grow for a minute); 8,192 tokens: the corpus's longest conversations fit
            "server": {"model": SMOLLM2, "ctx_size": 8192, "parallel": 1, "threads": 2, "stop_grace_s": 3},
            "configurations": [
                {"name": "cache-fits", "algorithm": "none", "engine_args": ["--cache-ram", "192"]},
                {"name": "cache-default", "algorithm": "none"},  # llama-server's default cap: 8192 MiB
            ],
            "measurement": _measurement(),
            "soak": {
                "duration_s": 75,
                "shape": {"kind": "steady", "users": 2},
                "prompts": "builtin:conversations",
                "prompt_reuse": "forbid",
                "max_tokens": 8,
                # memory the engine may hold: room for a 192 MiB cache, not for 8 GiB
                "watchdog": {
                    "probe_interval_s": 0.5,
                    "window_s": 8,
                    "warmup_windows": 1,
                    "reference_windows": 3,
                    "memory_limit_mib": 1200,
                    "memory_horizon_s": 3600,
                    "memory_fit_s": 300,
                },
            },
        },
    )


def test_prompt_cache_growth_to_a_cap_that_fits_is_named_and_one_that_does_not_is_a_memory_verdict(
    tmp_path: Path,
) -> None:
    proc = start_cli("run", str(_cache_scenario(tmp_path)), "--results", str(tmp_path / "results"))
    out = finish(proc, 900)
    run_dir = next((tmp_path / "results").glob("*-cache"))
    verdicts = list(read_jsonl(run_dir / VERDICTS))
    windows = list(read_jsonl(run_dir / WINDOWS))
    fits = [w for w in windows if w["config"] == "cache-fits"]
    default = [w for w in windows if w["config"] == "cache-default"]
    # the cache grows with distinct prompts, and its cap is read from the engine's own log
    # (the default cap's soak is stopped by its memory verdict within a few windows: it grows less before that)
    # (long conversations: a few requests a window; each adds one prompt's KV, 1-60 MiB)
    # (it may also shrink: in one run the capped cache went 10.8 -> 65 -> 11.4 MiB, the large prompt dropped again, so
    # growth is its largest size past its first, not its last)
    for wins, growth_mib in ((fits, 2.0), (default, 2.0)):
        sizes = [w["prompt_cache_mib"] for w in wins if w.get("prompt_cache_mib") is not None]
        assert len(sizes) >= 3 and max(sizes[1:]) > sizes[0] + growth_mib, sizes
    assert {w["prompt_cache_cap_mib"] for w in fits if w.get("prompt_cache_cap_mib")} == {192.0}
    assert {w["prompt_cache_cap_mib"] for w in default if w.get("prompt_cache_cap_mib")} == {8192.0}
    # the engine's memory grows with it; what the watchdog judges is that growth less the cache
    rss = [w["engine_rss_mib"] for w in fits]
    assert rss[-1] > rss[0] + 5, rss

    # a cap that fits: no verdict at all (memory, cache or throughput: a healthy engine), and the report names the growth
    assert [v for v in verdicts if v["config"] == "cache-fits"] == []
    # a cap that does not fit: the warning, then the memory verdict, which stops that configuration (exit 4); nothing
    # else (conversations of very different lengths swing 8-s windows' throughput: not a collapse)
    kinds = [v["kind"] for v in verdicts if v["config"] == "cache-default"]
    assert kinds[:1] == ["cache_cap"] and "memory" in kinds and set(kinds) <= {"cache_cap", "memory"}, verdicts
    assert not [w for w in windows if w["errors"]], "no request failed"
    memory = next(v for v in verdicts if v["kind"] == "memory")
    assert memory["metric"] == "prompt_cache_mib" and memory["action"] == "stop_config"
    # it explains itself: every other series against its reference, in the evidence and the message
    assert memory["evidence"]["explanation"]["moves"], memory["evidence"]
    assert memory["evidence"]["explanation"]["text"] in memory["message"]
    assert proc.returncode == EXIT_SOAK, out[-3000:]
    report = (run_dir / "report.md").read_text()
    assert "Prompt cache of cache-fits: cache growth" in report and "by design" in report
    assert "Prompt cache of cache-default: cache growth" in report and "cache_cap verdict" in report
    manifest = json.loads((run_dir / "manifest.json").read_text())
    assert manifest["configurations"]["cache-default"]["soak"]["first_failure"]["kind"] == "memory"
