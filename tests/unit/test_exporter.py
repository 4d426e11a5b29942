"""The exporter, the engines' targets file and the OpenMetrics export, without an engine."""

from __future__ import annotations

import json
import urllib.request
from pathlib import Path

import prometheus_client
import pytest
from prometheus_client.openmetrics.parser import text_string_to_metric_families as parse_openmetrics
from prometheus_client.parser import text_string_to_metric_families

from engines.types import Capacity
from harness.metrics.exporter import CONFIG_LABELS, MAX_POSITIONS, VERDICT_KINDS, WATCHED_METRICS, MetricsExporter
from harness.metrics.openmetrics import export_openmetrics
from harness.metrics.targets import EngineTargetsFile
from harness.records.files import RequestRecord
from harness.records.types import Failure, Manifest, Phase, SoakWindow, Verdict

RUN_QUICK = Path(__file__).resolve().parents[1] / "fixtures" / "run_quick"
MANIFEST_LINE = {
    "run_id": "r1",
    "scenario": "t",
    "engine": "llamacpp",
    "engine_version": "11434",
    "specsoak_version": "0.1.0",
    "started_unix": 1000.0,
}
MANIFEST = Manifest.from_dict(MANIFEST_LINE)
ALLOWED_LABELS = set(CONFIG_LABELS) | {
    "phase",
    "streams",
    "status",
    "error_kind",
    "position",
    "role",
    "buffer",
    "kind",
    "stage",
    "metric",
    "le",
    "scenario",
    "engine_version",
    "specsoak_version",
}


def _request(status: str = "ok", **kw: object) -> RequestRecord:
    rec: dict[str, object] = {
        "config": "spec",
        "phase": "measure",
        "streams": 1,
        "repetition": 1,
        "stream": 0,
        "index": 0,
        "prompt_id": "p",
        "status": status,
        "start_unix_s": 1001.0,
    }
    if status == "ok":
        rec.update(ttft_s=0.2, e2e_s=0.5, output_tokens=16, decode_tps=50.0, itl_s=[0.02, 0.03])
    rec.update(kw)
    return RequestRecord.from_dict(rec)


PHASE = Phase.from_dict(
    {
        "config": "spec",
        "phase": "measure",
        "streams": 1,
        "repetition": 1,
        "start_unix_s": 1001.0,
        "end_unix_s": 1003.0,
        "total_tps": 40.0,
        "median_decode_tps": 50.0,
        "cpu": {"other_cores": 0.01, "engine_cores": 1.9},
        "counters": {
            "draft_tokens": 40,
            "accepted_tokens": 30,
            "verify_steps": 10,
            "accepted_per_position": [10, 9, 8] + [1] * 30,
        },
        "acceptance": 0.75,
        "mean_accept_len": 4.0,
        "per_position": [1.0, 0.9, 0.8],
    }
)


def scrape(url: str) -> dict[tuple[str, tuple[tuple[str, str], ...]], float]:
    with urllib.request.urlopen(url, timeout=5) as r:
        text = r.read().decode()
    return {
        (s.name, tuple(sorted(s.labels.items()))): s.value
        for fam in text_string_to_metric_families(text)
        for s in fam.samples
    }


def value(samples: dict, name: str, **labels: str) -> float:
    hits = [
        v
        for (n, lab), v in samples.items()
        if n == name and all(dict(lab).get(k) == want for k, want in labels.items())
    ]
    assert len(hits) == 1, f"{name}{labels}: {len(hits)} samples"
    return hits[0]


def test_exporter_serves_every_figure_on_loopback() -> None:
    rss = {123: 200 * 1024 * 1024}
    exp = MetricsExporter(port=0, process_reader=rss.get, clock=lambda: 1234.0)
    with exp:
        assert exp.host == "127.0.0.1" and exp.port > 0
        exp.on_run_start(MANIFEST)
        exp.on_config_start("spec", "draft-simple", False, "llamacpp", "http://127.0.0.1:9", 123)
        exp.on_capacity(
            "spec",
            Capacity.from_dict(
                {
                    "slots": 4,
                    "ctx_per_slot": 2048,
                    "ctx_total": 8192,
                    "target": {"model_mib": 92.0, "kv_mib": 180.0, "compute_mib": 44.0},
                    "draft": {"model_mib": 92.0, "kv_mib": 180.0, "compute_mib": 10.0},
                }
            ),
            1.5,
        )
        exp.on_request(_request())
        exp.on_request(_request("error", error_kind="timeout"))
        exp.on_phase(PHASE)
        exp.on_failure(
            Failure.from_dict(
                {"config": "spec", "stage": "measure", "kind": "EngineCrashed", "message": "x", "unix_s": 1005.0}
            )
        )
        exp.record_verdict("spec", "drift", "decode_tps")
        s = scrape(exp.url)
        assert value(s, "specsoak_requests_total", status="ok", error_kind="", phase="measure") == 1
        assert value(s, "specsoak_requests_total", status="error", error_kind="timeout") == 1
        assert value(s, "specsoak_output_tokens_total", phase="measure") == 16
        assert value(s, "specsoak_request_ttft_seconds_count", phase="measure") == 1
        assert value(s, "specsoak_request_inter_token_seconds_count", phase="measure") == 2
        assert value(s, "specsoak_cumulative_acceptance_ratio", config="spec") == pytest.approx(0.75)
        assert value(s, "specsoak_cumulative_mean_acceptance_length", config="spec") == pytest.approx(4.0)
        assert value(s, "specsoak_phase_position_acceptance_ratio", position="1") == pytest.approx(0.9)
        assert value(s, "specsoak_accepted_tokens_per_position_total", position="0") == 10
        assert sum(1 for (n, _l) in s if n == "specsoak_accepted_tokens_per_position_total") == MAX_POSITIONS
        assert value(s, "specsoak_total_tokens_per_second", streams="1") == 40.0
        assert value(s, "specsoak_solo_decode_tokens_per_second", config="spec") == 50.0
        assert value(s, "specsoak_servable_context_tokens", config="spec") == 2048
        assert value(s, "specsoak_engine_slots", config="spec") == 4
        assert value(s, "specsoak_engine_buffer_bytes", role="draft", buffer="kv") == 180 * 1024 * 1024
        assert value(s, "specsoak_engine_up", config="spec") == 1
        assert value(s, "specsoak_engine_resident_memory_bytes", config="spec") == 200 * 1024 * 1024
        assert value(s, "specsoak_config_failures_total", kind="EngineCrashed", stage="measure") == 1
        assert value(s, "specsoak_watchdog_verdicts_total", kind="drift", metric="decode_tps") == 1
        assert value(s, "specsoak_engine_start_time_seconds", config="spec") == 1234.0
        assert value(s, "specsoak_run_info", run="r1", engine_version="11434") == 1
        for name, labels in s:
            if name.startswith("specsoak_"):
                assert {k for k, _ in labels} <= ALLOWED_LABELS, f"{name} has an unbounded label: {labels}"
        rss.clear()  # the engine died: up 0, no RSS
        s = scrape(exp.url)
        assert value(s, "specsoak_engine_up", config="spec") == 0
        assert not [k for k in s if k[0] == "specsoak_engine_resident_memory_bytes"]
        exp.on_config_end("spec", "done")
        s = scrape(exp.url)
        assert not [k for k in s if k[0] == "specsoak_engine_up"], "a stopped configuration is not 'down'"
    with pytest.raises(OSError):  # noqa: PT011  refused or reset: any connection error means it is down
        urllib.request.urlopen(exp.url if exp._server else "http://127.0.0.1:1/metrics", timeout=2)


def test_exporter_keeps_out_of_the_global_registry() -> None:
    exp = MetricsExporter(process_reader=None)
    exp.on_run_start(MANIFEST)
    names = {m.name for m in prometheus_client.REGISTRY.collect()}
    assert not [n for n in names if n.startswith("specsoak")]
    assert exp.registry is not prometheus_client.REGISTRY


LAB = {"run": "r1", "config": "spec", "engine": "llamacpp", "algorithm": "draft-simple", "synthetic": "false"}


def _window(**kw: object) -> SoakWindow:
    """A closed soak window as harness/soak/slice.py hands it to on_window."""
    win: dict[str, object] = {
        "config": "spec",
        "slice": "s1",
        "t_start_unix": 2000.0,
        "t_end_unix": 2060.0,
        "t_unix": 2030.0,
        "requests": 20,
        "errors": 1,
        "error_kinds": {"timeout": 1},
        "output_tokens": 2400,
        "output_tps": 40.0,
        "decode_tps": 25.0,
        "ttft_p95_s": 0.8,
        "error_ratio": 0.05,
        "acceptance": 0.6,
        "mean_accept_len": 2.5,
        "engine_rss_mib": 512.0,
        "harness_rss_mib": 128.0,
        "users": 4,
        "engine_uptime_s": 3600.0,
        "counters": {
            "draft_tokens": 1000,
            "accepted_tokens": 600,
            "verify_steps": 400,
            "accepted_per_position": [300, 200, 100],
        },
        "cpu": {"engine_cores": 1.5, "harness_cores": 0.25, "other_cores": 0.05},
        "contaminated": False,
        "judged": True,
        "not_judged_why": None,
        "detectors": {
            "output_tps": {"reference": 50.0, "score": 3.5, "in_episode": False, "relative_change": -0.2},
            "decode_tps": {"reference": 30.0, "score": 9.0, "in_episode": True, "relative_change": -0.17},
            "acceptance": {"reference": None, "score": 0.0, "in_episode": False, "relative_change": None},
            "made_up": {"reference": 1.0, "score": 1.0, "in_episode": True, "relative_change": 0.0},
        },
        "memory_headroom_s": 1800.0,
        "machine_memory_available_mib": 4096.0,
    }
    win.update(kw)
    return SoakWindow.from_dict(win)


def _verdict(**kw: object) -> Verdict:
    """A watchdog verdict as harness/soak/slice.py hands it to on_verdict."""
    return Verdict.from_dict({"slice": "s1", "metric": None, "message": "", "evidence": {}, "action": "record", **kw})


def _soak_exporter() -> MetricsExporter:
    exp = MetricsExporter(process_reader=None, clock=lambda: 5000.0)
    exp.on_run_start(Manifest.from_dict({**MANIFEST_LINE, "machine": {"mem_total_mib": 16384}}))
    exp.on_config_start("spec", "draft-simple", False, "llamacpp", "http://127.0.0.1:9", None)
    return exp


def test_soak_window_figures_are_exported() -> None:
    exp = _soak_exporter()
    exp.on_window(_window())
    get = exp.registry.get_sample_value
    mib = 1024 * 1024
    for name, want in (
        ("specsoak_soak_output_tokens_per_second", 40.0),
        ("specsoak_soak_decode_tokens_per_second", 25.0),
        ("specsoak_soak_ttft_p95_seconds", 0.8),
        ("specsoak_soak_error_ratio", 0.05),
        ("specsoak_soak_acceptance_ratio", 0.6),
        ("specsoak_soak_mean_acceptance_length", 2.5),
        ("specsoak_soak_engine_memory_bytes", 512 * mib),
        ("specsoak_soak_users", 4),
        ("specsoak_engine_uptime_seconds", 3600.0),
        ("specsoak_soak_memory_headroom_seconds", 1800.0),
        ("specsoak_harness_resident_memory_bytes", 128 * mib),
        ("specsoak_soak_engine_cpu_cores", 1.5),
        ("specsoak_soak_harness_cpu_cores", 0.25),
        ("specsoak_soak_other_cpu_cores", 0.05),
        ("specsoak_soak_window_judged", 1.0),
        ("specsoak_soak_window_end_time_seconds", 2060.0),
        ("specsoak_soak_windows_total", 1.0),
    ):
        assert get(name, LAB) == pytest.approx(want), name
    assert get("specsoak_machine_memory_bytes", {"run": "r1", "kind": "total"}) == 16384 * mib
    assert get("specsoak_machine_memory_bytes", {"run": "r1", "kind": "available"}) == 4096 * mib
    assert get("specsoak_soak_change_score", {**LAB, "metric": "decode_tps"}) == 9.0
    assert get("specsoak_soak_collapsed", {**LAB, "metric": "decode_tps"}) == 1.0
    assert get("specsoak_soak_collapsed", {**LAB, "metric": "output_tps"}) == 0.0
    assert get("specsoak_soak_reference", {**LAB, "metric": "output_tps"}) == 50.0
    assert get("specsoak_soak_relative_change", {**LAB, "metric": "output_tps"}) == pytest.approx(-0.2)
    # the metric label stays bounded: a detector the exporter does not know is not exported
    metrics = {
        s.labels["metric"]
        for fam in exp.registry.collect()
        if fam.name.startswith("specsoak_soak_")
        for s in fam.samples
        if "metric" in s.labels
    }
    assert metrics <= set(WATCHED_METRICS) and "made_up" not in metrics


def test_the_windows_with_traffic_are_counted_judged_or_not_and_why_not() -> None:
    """The coverage live (docs/soak.md#coverage): share judged = judged="true" over all, per configuration."""
    exp = _soak_exporter()
    get = exp.registry.get_sample_value
    exp.on_window(_window())
    exp.on_window(_window(judged=False, not_judged_why="warm-up"))
    exp.on_window(_window(judged=False, not_judged_why="warm-up"))
    exp.on_window(_window(judged=False, not_judged_why="no load", users=0, requests=0, output_tps=0.0))
    assert get("specsoak_soak_traffic_windows_total", {**LAB, "judged": "true", "why": ""}) == 1.0
    assert get("specsoak_soak_traffic_windows_total", {**LAB, "judged": "false", "why": "warm-up"}) == 2.0
    # no load offered, nothing served: not a window with traffic
    assert get("specsoak_soak_traffic_windows_total", {**LAB, "judged": "false", "why": "no load"}) is None
    assert get("specsoak_soak_windows_total", LAB) == 4.0

    exp = _soak_exporter()
    get = exp.registry.get_sample_value
    exp.on_window(_window())
    # nothing finished in the next window: no decode t/s, no TTFT, no acceptance; memory stopped growing
    exp.on_window(
        _window(
            output_tps=0.0,
            decode_tps=None,
            ttft_p95_s=None,
            acceptance=None,
            mean_accept_len=None,
            error_ratio=None,
            users=None,
            memory_headroom_s=None,
            judged=False,
            not_judged_why="too few requests",
            counters=None,
        )
    )
    assert get("specsoak_soak_output_tokens_per_second", LAB) == 0.0, "no output in a window is a real 0"
    for name in (
        "specsoak_soak_decode_tokens_per_second",
        "specsoak_soak_ttft_p95_seconds",
        "specsoak_soak_acceptance_ratio",
        "specsoak_soak_mean_acceptance_length",
        "specsoak_soak_error_ratio",
        "specsoak_soak_users",
        "specsoak_soak_memory_headroom_seconds",
    ):
        assert get(name, LAB) is None, f"{name}: a window without the figure must not keep the last value or export 0"
    assert get("specsoak_soak_window_judged", LAB) == 0.0
    assert get("specsoak_soak_reference", {**LAB, "metric": "acceptance"}) is None
    assert get("specsoak_soak_change_score", {**LAB, "metric": "acceptance"}) == 0.0
    assert get("specsoak_soak_collapsed", {**LAB, "metric": "ttft_p95_s"}) is None, (
        "a metric the detector did not report has no state"
    )
    assert get("specsoak_draft_tokens_total", LAB) == 1000, "a window without engine counters adds nothing"


def test_window_counter_deltas_add_to_the_measured_phases() -> None:
    exp = _soak_exporter()
    get = exp.registry.get_sample_value
    exp.on_phase(PHASE)
    exp.on_window(_window())
    exp.on_window(
        _window(
            counters={"draft_tokens": -50, "accepted_tokens": None, "verify_steps": 10, "accepted_per_position": []}
        )
    )
    assert get("specsoak_draft_tokens_total", LAB) == 40 + 1000, "a negative delta (engine restarted) adds nothing"
    assert get("specsoak_accepted_tokens_total", LAB) == 30 + 600
    assert get("specsoak_verify_steps_total", LAB) == 10 + 400 + 10
    assert get("specsoak_accepted_tokens_per_position_total", {**LAB, "position": "2"}) == 8 + 100
    # the verdict's pooled acceptance stays that of the measured phases
    assert get("specsoak_cumulative_acceptance_ratio", LAB) == pytest.approx(0.75)


def test_config_end_removes_the_soak_state() -> None:
    exp = _soak_exporter()
    get = exp.registry.get_sample_value
    exp.on_window(_window())
    exp.on_config_end("spec", "done")
    assert get("specsoak_soak_collapsed", {**LAB, "metric": "decode_tps"}) is None, "a stopped engine is in no episode"
    assert get("specsoak_soak_memory_headroom_seconds", LAB) is None
    assert get("specsoak_soak_output_tokens_per_second", LAB) is None
    assert get("specsoak_soak_windows_total", LAB) == 1.0, "counters stay"


def test_verdicts_carry_their_kind() -> None:
    exp = _soak_exporter()
    get = exp.registry.get_sample_value
    exp.on_verdict(
        _verdict(
            t_unix=2100.0, config="spec", kind="collapse", metric="decode_tps", action="none", engine_uptime_s=60.0
        )
    )
    exp.on_verdict(_verdict(t_unix=2200.0, config="spec", kind="crash", action="restart"))
    exp.on_verdict(_verdict(t_unix=2300.0, config="spec", kind="brand_new_kind", metric="nonsense"))
    exp.record_verdict("spec", "memory", "engine_memory_mib")
    assert get("specsoak_watchdog_verdicts_total", {**LAB, "kind": "collapse", "metric": "decode_tps"}) == 1
    assert get("specsoak_watchdog_verdict_time_seconds", {**LAB, "kind": "collapse", "metric": "decode_tps"}) == 2100.0
    assert get("specsoak_watchdog_verdicts_total", {**LAB, "kind": "crash", "metric": ""}) == 1
    assert get("specsoak_watchdog_verdicts_total", {**LAB, "kind": "other", "metric": "other"}) == 1, (
        "unknown kind and metric are 'other'"
    )
    assert (
        get("specsoak_watchdog_verdict_time_seconds", {**LAB, "kind": "memory", "metric": "engine_memory_mib"})
        == 5000.0
    ), "no time: the clock's"
    kinds = {
        s.labels["kind"]
        for fam in exp.registry.collect()
        if fam.name == "specsoak_watchdog_verdicts"
        for s in fam.samples
    }
    assert kinds <= set(VERDICT_KINDS) and not kinds & {"pass", "warn", "fail"}


def test_targets_file_lists_the_engine_serving_now(tmp_path: Path) -> None:
    t = EngineTargetsFile(tmp_path)
    t.on_run_start(MANIFEST)
    run_file = tmp_path / "r1" / "prometheus" / "engines.json"
    shared = tmp_path / "prometheus-targets" / "r1.json"
    assert json.loads(run_file.read_text()) == [] == json.loads(shared.read_text())
    t.on_config_start("spec", "draft-simple", True, "llamacpp", "http://127.0.0.1:8123", 1)
    groups = json.loads(run_file.read_text())
    assert groups == [
        {
            "targets": ["127.0.0.1:8123"],
            "labels": {
                "run": "r1",
                "config": "spec",
                "engine": "llamacpp",
                "algorithm": "draft-simple",
                "synthetic": "true",
            },
        }
    ]
    assert json.loads(shared.read_text()) == groups
    t.on_config_end("spec", "done")
    assert json.loads(run_file.read_text()) == []


@pytest.mark.parametrize(
    ("engine", "url", "path"),
    [
        ("llamacpp", "http://127.0.0.1:8123", None),
        ("vllm", "http://127.0.0.1:8123/", None),
        ("trtllm", "http://127.0.0.1:8123", "/prometheus/metrics"),  # its /metrics is JSON iteration stats
        ("llamacpp", "http://127.0.0.1:8123/proxy/", "/proxy/metrics"),
        ("trtllm", "http://127.0.0.1:8123/proxy", "/proxy/prometheus/metrics"),
    ],
)
def test_targets_file_names_each_engines_metrics_path(tmp_path: Path, engine: str, url: str, path: str | None) -> None:
    t = EngineTargetsFile(tmp_path)
    t.on_run_start(MANIFEST)
    t.on_config_start("spec", "draft-eagle3", False, engine, url, 1)
    (group,) = json.loads((tmp_path / "r1" / "prometheus" / "engines.json").read_text())
    assert group["labels"].get("__metrics_path__") == path


def test_openmetrics_export_of_a_real_run() -> None:
    text = export_openmetrics(RUN_QUICK)
    assert text.endswith("# EOF\n")
    # prometheus_client's parser rejects a histogram with more than one timestamped point (promtool,
    # the consumer, reads them: tests/integration/test_prometheus_backfill.py), so histograms are
    # checked here by hand and everything else by the parser.
    hist = {line.split()[2] for line in text.splitlines() if line.startswith("# TYPE") and line.endswith(" histogram")}
    assert {
        "specsoak_request_ttft_seconds",
        "specsoak_request_inter_token_seconds",
        "specsoak_request_e2e_seconds",
    } <= hist
    kept = [
        line
        for line in text.splitlines()
        if not any(line.startswith((h + "_", f"# TYPE {h} ", f"# HELP {h} ")) for h in hist)
    ]
    inf = [
        line
        for line in text.splitlines()
        if line.startswith("specsoak_request_ttft_seconds_bucket") and 'le="+Inf"' in line
    ]
    count = [line for line in text.splitlines() if line.startswith("specsoak_request_ttft_seconds_count")]
    assert len(inf) == len(count) > 0 and [x.split()[-2:] for x in inf] == [x.split()[-2:] for x in count]
    families = {f.name: f for f in parse_openmetrics("\n".join(kept) + "\n")}
    for name in (
        "specsoak_requests",
        "specsoak_total_tokens_per_second",
        "specsoak_cumulative_acceptance_ratio",
        "specsoak_engine_buffer_bytes",
        "specsoak_run",
    ):
        assert name in families, name
    last: dict[tuple, float] = {}
    for fam in families.values():
        for s in fam.samples:
            assert s.timestamp is not None, s
            key = (s.name, tuple(sorted(s.labels.items())))
            t = float(s.timestamp)
            assert t > last.get(key, 0.0), f"{key}: timestamps must increase"
            last[key] = t
    # the export's figures are the run's: 1 stream solo decode = median of measured requests at 1 stream
    reqs = [json.loads(line) for line in (RUN_QUICK / "requests.jsonl").read_text().splitlines()]
    solo = sorted(
        r["decode_tps"]
        for r in reqs
        if r["config"] == "baseline" and r["phase"] == "measure" and r["streams"] == 1 and r["status"] == "ok"
    )
    final = [s for s in families["specsoak_solo_decode_tokens_per_second"].samples if s.labels["config"] == "baseline"][
        -1
    ]
    mid = len(solo) // 2
    assert final.value == pytest.approx(solo[mid] if len(solo) % 2 else (solo[mid - 1] + solo[mid]) / 2)
    total = [
        s
        for s in families["specsoak_requests"].samples
        if s.labels["config"] == "ngram-map-k" and s.labels["phase"] == "measure"
    ][-1]
    assert total.value == sum(1 for r in reqs if r["config"] == "ngram-map-k" and r["phase"] == "measure")


def test_cli_export_writes_openmetrics(tmp_path: Path) -> None:
    import subprocess
    import sys

    out = tmp_path / "run.om"
    cli = [sys.executable, "-c", "from harness.cli import main; main()"]
    proc = subprocess.run(
        [*cli, "export", str(RUN_QUICK), "--openmetrics", "--out", str(out)],
        capture_output=True,
        text=True,
        timeout=120,
        check=False,
    )
    assert proc.returncode == 0, proc.stderr
    assert out.read_text() == export_openmetrics(RUN_QUICK)
    proc = subprocess.run(
        [*cli, "export", str(tmp_path), "--openmetrics"], capture_output=True, text=True, timeout=120, check=False
    )
    assert proc.returncode == 2 and "not a run folder" in proc.stderr


def test_gpu_memory_of_a_window_is_exported_and_absent_without_a_gpu() -> None:
    exp = _soak_exporter()
    get = exp.registry.get_sample_value
    mib = 1024 * 1024
    exp.on_window(
        _window(gpu_used_mib=30_000.0, gpu_total_mib=32_768.0, engine_gpu_mib=29_000.0, gpu_headroom_s=5400.0)
    )
    assert get("specsoak_soak_gpu_memory_bytes", {**LAB, "kind": "used"}) == 30_000 * mib
    assert get("specsoak_soak_gpu_memory_bytes", {**LAB, "kind": "total"}) == 32_768 * mib
    assert get("specsoak_soak_gpu_memory_bytes", {**LAB, "kind": "engine"}) == 29_000 * mib
    assert get("specsoak_soak_gpu_memory_headroom_seconds", LAB) == 5400.0
    exp.on_window(
        _window(
            gpu_used_mib=30_000.0,
            gpu_total_mib=32_768.0,
            engine_gpu_mib=None,
            gpu_headroom_s=None,
            gpu_slope_mib_per_h=-3.0,
        )
    )
    assert get("specsoak_soak_gpu_memory_bytes", {**LAB, "kind": "engine"}) is None, (
        "unknown per-process GPU memory is no series, never 0"
    )
    assert get("specsoak_soak_gpu_memory_headroom_seconds", LAB) == float("inf"), "not growing"
    exp.on_window(_window())  # no NVML: no GPU series at all
    for kind in ("used", "total", "engine"):
        assert get("specsoak_soak_gpu_memory_bytes", {**LAB, "kind": kind}) is None
    assert get("specsoak_soak_gpu_memory_headroom_seconds", LAB) is None
