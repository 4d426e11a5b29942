"""What a soak window records beside its traffic (harness/soak/figures.py), and why a verdict (harness/soak/explain.py):
stalls, the engine's own view from real /metrics captures, memory with swap and the prompt cache from a real
llama-server log, the work done since start."""

from __future__ import annotations

import os
from pathlib import Path

import pytest

from engines.llamacpp import LlamaCpp, cache_ram_mib
from engines.types import CacheState, EngineCounters, counters_delta
from engines.vllm import Vllm
from harness.probe.memory import TreeMemory, status_kib, tree_memory
from harness.soak.explain import explain
from harness.soak.figures import (
    cache_outlook,
    engine_view,
    longest_stall,
    memory_figures,
    paused_s,
    stall_figures,
    stall_trend,
    work_done,
)
from tests.conftest import FIXTURES


def test_stall_figures_take_the_longest_gap_of_any_request_and_the_slowest_probe() -> None:
    recs = [{"itl_s": [0.02, 0.03, 4.1, 0.02]}, {"itl_s": [0.05] * 50}, {"status": "error", "itl_s": []}]
    got = stall_figures(recs, [0.01, 3.9, 0.02])
    assert got["max_chunk_gap_s"] == 4.1
    assert got["probe_max_s"] == 3.9
    assert 0.05 <= got["itl_p99_s"] <= 4.1  # type: ignore[operator]  # measured here: not None
    # the engine's pause is the probe's silence: a stream's gap alone can be another request's prompt processing
    assert longest_stall(got) == 3.9
    assert stall_figures([], []) == {"max_chunk_gap_s": None, "itl_p99_s": None, "probe_max_s": None}
    assert longest_stall({"max_chunk_gap_s": 11.0, "probe_max_s": 0.01}) == 0.01
    assert longest_stall({"max_chunk_gap_s": 11.0}) is None


def test_stall_trend_follows_pauses_that_grow_with_uptime() -> None:
    # the GC-pause shape: 7 s at 1 h to 46 s at 6.5 h
    wins = [
        {"engine_uptime_s": h * 3600, "probe_max_s": 7 + (46 - 7) * (h - 1) / 5.5, "max_chunk_gap_s": 0.05}
        for h in (1, 2, 3, 3.5, 4, 5, 6, 6.5)
    ]
    worst, slope = stall_trend(wins)
    assert worst == pytest.approx(46)
    assert slope == pytest.approx(39 / 5.5, rel=0.01)
    assert stall_trend([{"engine_uptime_s": 1.0}]) == (None, None)


def test_engine_view_from_real_vllm_metrics() -> None:
    text = (FIXTURES / "vllm" / "real_cpu_032_eagle3.metrics.txt").read_text()
    after = Vllm.normalise_metrics(text)
    assert after.kv_usage == 0.0 and after.preemptions == 0.0
    assert after.prefix_cache_queries == 0.0 and after.prefix_cache_hits == 0.0
    assert after.requests_finished == 1.0  # summed over finished_reason
    before = EngineCounters(preemptions=0.0, prefix_cache_queries=0.0, prefix_cache_hits=0.0, requests_finished=0.0)
    view = engine_view(counters_delta(before, after))
    assert view["kv_usage"] == 0.0 and view["preemptions"] == 0.0
    assert view["prefix_hit_rate"] is None  # nothing looked up: no rate, not 0
    grown = EngineCounters(
        prefix_cache_queries=1000.0, prefix_cache_hits=910.0, kv_usage=0.58, preemptions=3.0, requests_deferred=2.0
    )
    view = engine_view(counters_delta(before, grown))
    assert view["prefix_hit_rate"] == pytest.approx(0.91)
    assert view["preemptions"] == 3.0 and view["requests_waiting"] == 2.0 and view["kv_usage"] == 0.58
    assert engine_view(None)["kv_usage"] is None


def test_llamacpp_prefix_cache_from_real_metrics() -> None:
    text = (FIXTURES / "llamacpp" / "spec_self_draft.GET_metrics_after.txt").read_text()
    c = LlamaCpp.normalise_metrics(text)
    # prompt_tokens_total excludes the cached tokens: looked up = processed + reused
    assert c.prefix_cache_hits == 0.0 and c.prefix_cache_queries == 208.0


def test_llamacpp_prompt_cache_cap_and_state_from_a_real_log() -> None:
    log = (FIXTURES / "llamacpp" / "base_lv4.server.log").read_text()
    assert LlamaCpp.parse_startup_log(log).prompt_cache_cap_mib == 8192.0
    assert LlamaCpp.cache_state(log) == CacheState(prompts=6, size_mib=14.25, cap_mib=8192.0)  # the newest line
    assert LlamaCpp.cache_state("no such line") is None
    assert Vllm.cache_state(log) is None  # an engine without a host prompt cache says nothing


def test_cache_ram_from_the_command_line() -> None:
    assert cache_ram_mib([]) == 8192
    assert cache_ram_mib(["--cache-ram", "512"]) == 512
    assert cache_ram_mib(["-cram=0"]) == 0
    assert cache_ram_mib(["--cache-ram", "-1"]) == -1


def test_tree_memory_counts_swapped_anonymous_memory(tmp_path: Path) -> None:
    pid = os.getpid()
    (tmp_path / str(pid)).mkdir()
    (tmp_path / str(pid) / "status").write_text(
        "Name:\tllama-server\nVmRSS:\t  102400 kB\nRssAnon:\t   51200 kB\nVmSwap:\t 9437184 kB\n"
    )
    mem = tree_memory(pid, proc_root=tmp_path)
    assert mem is not None
    assert mem.rss_mib == 100.0 and mem.swap_mib == 9216.0
    assert mem.anon_mib == 50.0 + 9216.0
    assert mem.held_mib == 9266.0  # a leak swapped out: RSS looks flat, anon + swap does not
    assert status_kib("VmSwap:\t 12 kB", "VmSwap") == 12 and status_kib("", "VmSwap") is None
    assert tree_memory(None) is None


def test_memory_figures_leave_the_prompt_cache_out_of_the_watched_memory() -> None:
    got = memory_figures(TreeMemory(rss_mib=2500.0, anon_mib=2400.0, swap_mib=0.0), CacheState(120, 2097.0, 8192.0))
    assert got["engine_memory_mib"] == pytest.approx(403.0)
    assert got["prompt_cache_mib"] == 2097.0 and got["prompt_cache_cap_mib"] == 8192.0
    assert memory_figures(TreeMemory(300.0, 900.0, 600.0), None)["engine_memory_mib"] == 900.0
    assert memory_figures(None, None)["engine_memory_mib"] is None


def test_cache_outlook_growth_to_a_cap_that_fits_is_not_a_threat() -> None:
    pts = [(60.0 * i, 431.0 + 100.0 * i) for i in range(10)]  # +6,000 MiB/h
    fits = cache_outlook(pts, 8192.0, available_mib=20_000.0)
    assert fits is not None and fits.fits and fits.runs_out_s is None
    tight = cache_outlook(pts, 8192.0, available_mib=3_000.0)
    assert tight is not None and not tight.fits
    assert tight.slope_mib_per_h == pytest.approx(6000.0)
    assert tight.runs_out_s == pytest.approx(3000.0 / 6000.0 * 3600.0)
    unlimited = cache_outlook(pts, -1.0, available_mib=20_000.0)
    assert unlimited is not None and not unlimited.fits
    assert cache_outlook([], 8192.0, 1.0) is None


def test_work_done_uses_the_engine_counters_else_counts_since_start() -> None:
    recs = [{"status": "ok", "output_tokens": 32}, {"status": "error"}]
    first = work_done(None, recs, None, restarted=True)
    assert first == {"engine_requests_done": 2.0, "engine_output_tokens_done": 32.0}
    assert work_done(first, recs, None, restarted=False) == {
        "engine_requests_done": 4.0,
        "engine_output_tokens_done": 64.0,
    }
    assert work_done(first, recs, None, restarted=True)["engine_requests_done"] == 2.0
    c = EngineCounters(output_tokens=5000.0, requests_finished=150.0)
    assert work_done(first, recs, c, restarted=False) == {
        "engine_requests_done": 150.0,
        "engine_output_tokens_done": 5000.0,
    }


def _win(i: int, **over: float) -> dict[str, object]:
    w: dict[str, object] = {
        "t_start_unix": 60.0 * i,
        "t_end_unix": 60.0 * (i + 1),
        "t_unix": 60.0 * i + 30,
        "engine_pid": 7,
        "output_tps": 100.0,
        "acceptance": 0.74,
        "kv_usage": 0.58,
        "prefix_hit_rate": 0.91,
        "engine_rss_mib": 900.0,
        "requests_waiting": 0.0,
        "cpu": {"engine_cores": 1.9},
    }
    w.update(over)
    return w


def test_explanation_lists_what_moved_with_the_verdict_and_what_did_not() -> None:
    wins = [_win(i) for i in range(10)]
    wins += [_win(i, acceptance=0.05, kv_usage=0.63, prefix_hit_rate=0.02) for i in range(10, 13)]
    why = explain(wins, onset_unix=600.0, metric="acceptance")
    moved = {m.metric for m in why.moved}
    assert moved == {"kv_usage", "prefix_hit_rate"}
    assert {m.metric for m in why.unchanged} >= {"engine_rss_mib", "requests_waiting", "engine_cores", "output_tps"}
    text = why.text()
    assert "KV usage 0.58 → 0.63" in text and "prefix-cache hit rate 0.91 → 0.02" in text
    assert text.endswith("unchanged") and "RSS MiB" in text
    assert why.to_dict()["text"] == text
    # a window of another engine (restarted) is no reference for this one
    other = [_win(i, engine_pid=8, kv_usage=0.1) for i in range(5)] + wins
    assert explain(other, 600.0, "acceptance").text() == text


def _soak_scenario(tmp_path: Path, soak: dict[str, object], configs: list[dict[str, object]] | None = None) -> Path:
    import yaml

    data = {
        "name": "w",
        "server": {"model": "m.gguf"},
        "configurations": configs or [{"name": "baseline", "algorithm": "none"}],
        "measurement": {"prompts": "builtin:repeat"},
        "soak": soak,
    }
    (tmp_path / "m.gguf").write_bytes(b"GGUF")
    path = tmp_path / "w.yaml"
    path.write_text(yaml.safe_dump(data))
    return path


def test_plan_says_how_much_work_a_soak_pushes_through(tmp_path: Path) -> None:
    from harness.config.loader import load_scenario
    from harness.run.plan import soak_work

    open_loop = load_scenario(
        _soak_scenario(
            tmp_path, {"duration_s": 3600, "max_tokens": 100, "arrival": {"kind": "poisson", "rate_rps": 2.0}}
        )
    ).scenario
    assert soak_work(open_loop).startswith("about 7,200 requests and 720,000 output tokens")
    closed = load_scenario(
        _soak_scenario(tmp_path, {"duration_s": 3600, "max_tokens": 100, "shape": {"kind": "steady", "users": 2}})
    ).scenario
    assert "2 users on average" in soak_work(closed)


def test_validate_warns_of_a_prompt_cache_cap_over_the_memory_limit(tmp_path: Path) -> None:
    from harness.config.checks import soak_warnings
    from harness.config.loader import load_scenario

    configs = [
        {"name": "default-cap", "algorithm": "none"},
        {"name": "small-cap", "algorithm": "none", "engine_args": ["--cache-ram", "256"]},
    ]
    sc = load_scenario(
        _soak_scenario(tmp_path, {"duration_s": 600, "watchdog": {"memory_limit_mib": 2048}}, configs)
    ).scenario
    warnings = [w for w in soak_warnings(sc) if "prompt cache" in w]
    assert len(warnings) == 1 and "'default-cap'" in warnings[0] and "8,192 MiB" in warnings[0]
    sc = load_scenario(
        _soak_scenario(tmp_path, {"duration_s": 600, "stall_s": 5, "watchdog": {"stall_warn_s": 5}})
    ).scenario
    assert any("stall_warn_s" in w for w in soak_warnings(sc))


def test_validate_warns_when_a_side_of_the_after_soak_comparison_has_one_repetition(tmp_path: Path) -> None:
    # Welch's interval needs a spread on each side (harness/common/stats.py): one repetition gives 'n/a', never
    # 'degraded', and the ramp's one fresh repetition once made a healthy soak look slower (docs/soak.md#coverage)
    import yaml

    from harness.config.checks import soak_warnings
    from harness.config.loader import load_scenario

    def warned(measurement: dict[str, object], soak: dict[str, object]) -> list[str]:
        path = _soak_scenario(tmp_path, {"duration_s": 600, **soak})
        data = yaml.safe_load(path.read_text())
        data["measurement"].update(measurement)
        path.write_text(yaml.safe_dump(data))
        return [w for w in soak_warnings(load_scenario(path).scenario) if "after-soak comparison" in w]

    (one,) = warned({}, {})  # measurement.repetitions defaults to 1
    assert one.startswith("measurement.repetitions is 1: ") and "'n/a'" in one
    (both,) = warned({}, {"after_repetitions": 1})
    assert both.startswith("measurement.repetitions is 1 and soak.after_repetitions is 1: ")
    (after,) = warned({"repetitions": 3}, {"after_repetitions": 1})
    assert after.startswith("soak.after_repetitions is 1: ")
    assert warned({"repetitions": 2}, {}) == []


def test_sglang_kv_usage_and_retractions_from_its_metrics() -> None:
    from engines.sglang import SGLang

    c = SGLang.normalise_metrics((FIXTURES / "sglang" / "eagle3.metrics.txt").read_text())
    assert c.kv_usage == 0.0 and c.requests_finished is not None
    text = '# TYPE sglang:num_retracted_requests_total counter\nsglang:num_retracted_requests_total{model_name="m"} 3\n'
    assert SGLang.normalise_metrics(text).preemptions == 3.0


def test_paused_s_is_the_share_of_a_window_a_pause_covered_in_every_window_it_straddles() -> None:
    pauses = [(146.0, 154.0), (170.0, 171.0), (170.5, 172.0)]  # the last two overlap: counted once
    assert paused_s(pauses, 141.0, 151.0) == pytest.approx(5.0)
    assert paused_s(pauses, 151.0, 161.0) == pytest.approx(3.0)
    assert paused_s(pauses, 161.0, 171.5) == pytest.approx(1.5)
    assert paused_s(pauses, 131.0, 141.0) == 0.0 and paused_s([], 0.0, 10.0) == 0.0
