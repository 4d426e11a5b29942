"""The soak's reason to exist, end to end, on one engine life: faults planted one after another inside the real
llama-server a `specsoak run` soaks, each scheduled from the soak's own records (never at a fixed second of uptime),
each a verdict with its onset; the last one stops the configuration, fires the alert in a real Prometheus scraping the
run, and ends the run with exit code 4. ``test_soak_healthy.py`` runs the same soak unplanted: no verdict at all.

The plants, in order, once the records say the reference is built (the first judged window):

1. pauses that grow with uptime (SGLang PR #28067's GC pauses 7 s -> 23 s -> 46 s): SIGSTOP for 2, 4 and 8 s, two
   windows apart. The 2-s pause is under the stall floor; the 4-s one is a ``stall`` verdict before any request fails,
   and the 8-s one is named again (the pauses grow);
2. wrong answers (vLLM #21082, MTP giving wrong tokens under load): the fault proxy corrupts every whole answer from
   then on, so the output canary's next round differs from its first answers at ``CORRUPT_FROM``: a ``divergence``
   (recorded here, so the soak goes on to the last plant); then the proxy answers truly again;
3. a collapse tied to uptime: the engine frozen for 85% of every second until it is gone. It still answers /health
   within the hang limit, so this is a throughput collapse, not a hang: a ``collapse`` within three windows, action
   ``stop_config``.
"""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import time
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import pytest
import yaml

from harness.common.net import free_port
from harness.metrics import dashboards, rules, scrape
from harness.metrics.targets import SHARED_DIR
from harness.records.files import AFTER_SOAK, VERDICTS, WINDOWS, read_jsonl
from harness.soak.canary import CANARY
from harness.soak.figures import longest_stall
from harness.soak.slice import SETTLE_WINDOWS
from tests.faults.proxy import CORRUPT_FROM, FaultProxy
from tests.integration.conftest import SMOLLM2
from tests.integration.plants import DutyCyclePlant, pause, soak_engine
from tests.integration.test_prometheus import Prometheus, _has_data, _tool
from tests.integration.test_soak_watch import _measurement

pytestmark = pytest.mark.engine

WINDOW_S = 10.0
SOAK_S = 600.0  # an upper bound: the collapse stops the configuration long before
EXIT_SOAK = 4
PAUSES_S = (2.0, 4.0, 8.0)
STALL_WARN_S = 3.0
CONFIG = "self-draft"
CANARY_PROMPTS = ["Count from 1 to 20, separated by commas.", "Name three colours and one thing of each colour."]


def scenario(
    folder: Path,
    name: str,
    engine_port: int,
    proxy_url: str,
    configs: list[dict[str, Any]],
    soak_s: float = SOAK_S,
    actions: dict[str, str] | None = None,
) -> Path:
    """The soak the gauntlet plants in and the healthy test leaves alone (same load, same watchdog)."""
    data = {
        "name": name,
        "server": {
            "model": SMOLLM2,
            "ctx_size": 2048,
            "parallel": 2,
            "threads": 2,
            "stop_grace_s": 3,
            "port": engine_port,
            "request_base_url": proxy_url,
        },
        "configurations": configs,
        # the test's own Prometheus (1-s scrapes), fault proxy and plant share the machine: 0.03-0.09 cores in a quiet
        # fresh-clone run
        "measurement": _measurement(contamination_cores=0.15),
        # a per-request SLO, so the soak windows have goodput for its dashboard panel (generous: it judges nothing here)
        "slo": {"e2e_s_max": 30.0},
        "soak": {
            "duration_s": soak_s,
            # a stationary load, so that only a plant can move the figures: the same short prompts throughout
            # (builtin:soak's conversations grow their context turn after turn, and decode t/s falls with it), and
            # one user (two closed-loop users drift between taking turns and being batched together, which halves
            # per-request decode t/s at the same total t/s: a real change of service, but not a plant's)
            "shape": {"kind": "steady", "users": 1},
            "prompts": "builtin:repeat",
            "max_tokens": 32,
            "stall_s": 30,
            "canary": {"every_s": 8, "max_tokens": 24, "prompts": CANARY_PROMPTS},
            "watchdog": {
                "probe_interval_s": 0.5,
                "hang_s": 30,
                "window_s": WINDOW_S,
                "warmup_windows": 1,
                "reference_windows": 3,
                # three 10-s windows: this VM slows by a quarter for 20 s now and then with the engine holding its two
                # cores (the healthy baseline, 2026-12-07: output t/s -22% and -26%, then back), which is no collapse
                "confirm_windows": 3,
                "error_rate": 0.5,
                "min_requests": 5,
                "memory_fit_s": 40,
                "stall_warn_s": STALL_WARN_S,
                "actions": actions or {},
            },
        },
    }
    path = folder / f"{name}.yaml"
    path.write_text(yaml.safe_dump(data, sort_keys=False))
    return path


def start_run(scenario_path: Path, results: Path, *extra: str) -> tuple[subprocess.Popen[bytes], Path]:
    """`specsoak run` in its own process group, its output to a file (never a pipe nobody drains while the test
    waits on the records)."""
    out = results.parent / "harness.out"
    results.mkdir(parents=True, exist_ok=True)
    with open(out, "wb") as f:
        proc = subprocess.Popen(
            [sys.executable, "-m", "harness.cli", "run", str(scenario_path), "--results", str(results), *extra],
            stdout=f,
            stderr=subprocess.STDOUT,
            env=dict(os.environ, COLUMNS="200"),
            start_new_session=True,
        )
    return proc, out


def wait_until(cond: Callable[[], Any], timeout_s: float, what: str, proc: subprocess.Popen[bytes], out: Path) -> Any:
    deadline = time.monotonic() + timeout_s
    while time.monotonic() < deadline:
        got = cond()
        if got:
            return got
        if proc.poll() is not None:
            raise AssertionError(f"harness exited ({proc.returncode}) waiting for {what}:\n{out.read_text()[-3000:]}")
        time.sleep(0.2)
    raise AssertionError(f"no {what} in {timeout_s:.0f} s:\n{out.read_text()[-3000:]}")


def _run_dir(results: Path, name: str) -> Path | None:
    return next(iter(results.glob(f"*-{name}")), None)


@pytest.fixture(scope="module")
def prometheus(tmp_path_factory: pytest.TempPathFactory) -> Iterator[tuple[Prometheus, int, Path]]:
    """A real Prometheus scraping the exporter port the planted run will serve (1 s scrapes, the project's rules)."""
    tmp = tmp_path_factory.mktemp("soakprom")
    port = free_port()
    results = tmp / "results"
    (results / SHARED_DIR).mkdir(parents=True)
    (tmp / "rules.yml").write_text(rules.dump_yaml(rules.rules_document()))
    cfg = scrape.prometheus_config(
        [f"127.0.0.1:{port}"],
        [str(results / SHARED_DIR / "*.json")],
        [str(tmp / "rules.yml")],
        scrape_interval="1s",
        sd_refresh="1s",
    )
    (tmp / "prometheus.yml").write_text(rules.dump_yaml(cfg))
    prom = Prometheus(
        _tool("prometheus"),
        tmp / "prometheus.yml",
        tmp / "data",
        tmp / "prometheus.log",
        ("--rules.alert.resend-delay=1s",),
    )
    try:
        yield prom, port, tmp
    finally:
        prom.stop()


@pytest.fixture(scope="module")
def gauntlet(prometheus: tuple[Prometheus, int, Path]) -> Iterator[dict[str, Any]]:
    prom, port, tmp = prometheus
    results = tmp / "results"
    engine_port = free_port()
    with FaultProxy(f"http://127.0.0.1:{engine_port}") as proxy:
        config = {"name": CONFIG, "algorithm": "draft-simple", "draft": SMOLLM2, "k": 2}
        # the gauntlet goes on after the wrong answers, to the collapse
        path = scenario(tmp, "gauntlet", engine_port, proxy.url, [config], actions={"divergence": "record"})
        proc, out = start_run(path, results, "--metrics-port", str(port), "--metrics-linger", "4")
        t0 = time.time()
        collapse = DutyCyclePlant(proc.pid, config=CONFIG)
        events: dict[str, Any] = {"pauses": []}
        try:
            run_dir = wait_until(lambda: _run_dir(results, "gauntlet"), 120, "run folder", proc, out)

            def verdicts(kind: str) -> list[dict[str, Any]]:
                return [v for v in read_jsonl(run_dir / VERDICTS) if v["kind"] == kind]

            def windows_after(t: float) -> list[dict[str, Any]]:
                return [w for w in read_jsonl(run_dir / WINDOWS) if w["t_start_unix"] >= t]

            eng = wait_until(lambda: soak_engine(proc.pid, CONFIG), 300, "soak engine", proc, out)
            first_judged = wait_until(
                lambda: next((w for w in read_jsonl(run_dir / WINDOWS) if w["judged"]), None),
                20 * WINDOW_S,
                "judged window (the reference built)",
                proc,
                out,
            )
            events["reference_built_unix"] = first_judged["t_end_unix"]
            # 1. growing pauses, each two whole windows after the last one ended; the last one straddles the end of
            # the window now open (it began when the last window was written, one window after that one ended), half
            # in each window, as a pause falls wherever it likes in a user's soak
            for i, seconds in enumerate(PAUSES_S):
                if i == len(PAUSES_S) - 1:
                    boundary = max(w["t_end_unix"] for w in read_jsonl(run_dir / WINDOWS)) + 2 * WINDOW_S
                    time.sleep(max(0.0, boundary - seconds / 2 - time.time()))
                began = pause(eng, seconds)
                events["pauses"].append((began, seconds))
                if seconds > STALL_WARN_S:  # its verdict before the next pause
                    wait_until(lambda n=i: len(verdicts("stall")) >= n, 6 * WINDOW_S, f"stall verdict {i}", proc, out)
                wait_until(lambda t=began + seconds: len(windows_after(t)) >= 2, 6 * WINDOW_S, "windows", proc, out)
            # 2. wrong answers until the canary says so, then true answers again
            proxy.corrupt_answers = True
            events["corrupt_unix"] = time.time()
            wait_until(lambda: verdicts("divergence"), 8 * WINDOW_S, "divergence verdict", proc, out)
            proxy.corrupt_answers = False
            events["true_again_unix"] = time.time()
            true_again = events["true_again_unix"]
            wait_until(lambda: len(windows_after(true_again)) >= 2, 6 * WINDOW_S, "windows", proc, out)
            # 3. the collapse: frozen 85% of every second until the harness stops the engine, from the end of the
            # window now open, so that its first window is frozen whole. The verdict's explanation takes the median of
            # the windows from the onset; with the plant anywhere in a window, CI (2026-12-03) had output t/s at -32%
            # and the engine's CPU under the explanation's 15% there (with one user, three requests a window, a
            # window before the plant can be 30% low by chance and open the episode: fixture gauntlet's 7.3 against 9.4)
            collapse.start()
            boundary = max(w["t_end_unix"] for w in read_jsonl(run_dir / WINDOWS)) + 2 * WINDOW_S
            time.sleep(max(0.0, boundary - time.time()))
            collapse.go.set()
            rc = proc.wait(timeout=20 * WINDOW_S)
        finally:
            collapse.done.set()
            if collapse.is_alive():
                collapse.join(10)
            if proc.poll() is None:
                os.killpg(proc.pid, signal.SIGKILL)
                proc.wait(10)
        yield {
            "rc": rc,
            "out": out.read_text(),
            "run_dir": run_dir,
            "plant": collapse,
            "events": events,
            "proxy_corrupted": proxy.corrupted,
            "t0": t0,
            "t1": time.time(),
            "prom": prom,
        }


def _verdicts(run_dir: Path, kind: str | None = None) -> list[dict[str, Any]]:
    return [v for v in read_jsonl(run_dir / VERDICTS) if kind is None or v["kind"] == kind]


def test_verdicts_come_in_the_order_of_the_plants_and_none_before_the_first(gauntlet: dict[str, Any]) -> None:
    run_dir, ev = gauntlet["run_dir"], gauntlet["events"]
    verdicts = _verdicts(run_dir)
    first_pause = ev["pauses"][0][0]
    # nothing before the first plant: the reference period was healthy; then exactly the planted kinds
    assert not [v for v in verdicts if v["t_unix"] < first_pause], verdicts
    assert {v["kind"] for v in verdicts} == {"stall", "divergence", "collapse"}, [
        (v["kind"], v.get("metric")) for v in verdicts
    ]
    # each kind after its own plant: no collapse from the pauses or the wrong answers
    onset = gauntlet["plant"].onset_unix
    assert onset is not None, gauntlet["out"][-3000:]
    assert all(v["t_unix"] >= onset for v in _verdicts(run_dir, "collapse")), verdicts
    assert all(ev["corrupt_unix"] <= v["t_unix"] for v in _verdicts(run_dir, "divergence"))
    assert all(v["t_unix"] < ev["corrupt_unix"] + WINDOW_S for v in _verdicts(run_dir, "stall")), verdicts


def test_pauses_that_grow_give_a_stall_verdict_at_the_first_over_the_floor_before_any_request_fails(
    gauntlet: dict[str, Any],
) -> None:
    run_dir, pauses = gauntlet["run_dir"], gauntlet["events"]["pauses"]
    stalls = _verdicts(run_dir, "stall")
    # the first stall verdict names the 4-s pause (the 2-s one is under the floor), before the 8-s pause began
    (t4, _), (t8, _) = pauses[1], pauses[2]
    first = stalls[0]
    assert t4 < first["t_unix"] < t8, (first, pauses)
    assert 3.5 <= first["evidence"]["longest_stall_s"] <= 5.5, first["evidence"]
    assert "explanation" in first["evidence"]
    # a longer pause is named again: the pauses grow
    assert any(v["evidence"]["longest_stall_s"] >= 1.5 * first["evidence"]["longest_stall_s"] for v in stalls[1:]), [
        (v["engine_uptime_s"], v["evidence"]["longest_stall_s"]) for v in stalls
    ]
    # no request failed: the verdict came long before a pause could fail one
    windows = list(read_jsonl(run_dir / WINDOWS))
    assert sum(w["errors"] for w in windows) == 0
    # the 8-s pause measured whole by the health probe's silence, wherever it fell in the streams
    assert max(longest_stall(w) or 0 for w in windows) >= 7.5
    # and it is in both windows it straddled (a collapse of neither: test_verdicts_come_in_the_order_of_the_plants)
    t8, s8 = pauses[2]
    straddled = [w for w in windows if w["t_start_unix"] < t8 + s8 and w["t_end_unix"] > t8]
    assert len(straddled) == 2 and all(w["paused_s"] >= 1.5 for w in straddled), [
        (w["t_start_unix"], w["t_end_unix"], w["paused_s"]) for w in straddled
    ]
    assert sum(w["paused_s"] for w in straddled) == pytest.approx(s8, abs=1.0)
    report = (run_dir / "report.md").read_text()
    assert "longest stall s" in report
    # llama-server's /metrics has no KV usage or preemption series: said, not shown as 0
    assert f"Not reported by {CONFIG}'s engine: KV usage, preemptions" in report


def test_a_corrupted_canary_answer_is_a_divergence_with_the_first_differing_token(gauntlet: dict[str, Any]) -> None:
    run_dir = gauntlet["run_dir"]
    assert gauntlet["proxy_corrupted"] >= 1
    div = _verdicts(run_dir, "divergence")
    assert len(div) == 1 and div[0]["config"] == CONFIG and div[0]["action"] == "record", div
    ev = div[0]["evidence"]
    assert ev["prompt_id"] in ("canary-0", "canary-1") and ev["first_diff"] == CORRUPT_FROM and ev["method"] == "tokens"
    assert ev["text"].endswith("corrupted answer") and ev["ref_text"] and ev["ref_text"] != ev["text"]
    assert div[0]["engine_uptime_s"] > 0
    recs = [r for r in read_jsonl(run_dir / CANARY) if r["config"] == CONFIG]
    corrupt_at = gauntlet["events"]["corrupt_unix"]
    # the rounds before the plant equal the first answers; a corrupted one differs at the corrupted token
    before = [r for r in recs if r["t_unix"] < corrupt_at and r.get("vs_first")]  # the first round is the reference
    assert before and all(r["vs_first"]["identical"] for r in before), before
    assert any((r.get("vs_first") or {}).get("first_diff") == CORRUPT_FROM for r in recs), recs
    report = (run_dir / "report.md").read_text()
    assert f"✗ divergence: {ev['prompt_id']} vs its first answer at token {CORRUPT_FROM}" in report


def test_planted_collapse_is_flagged_within_three_windows_and_stops_the_configuration(gauntlet: dict[str, Any]) -> None:
    run_dir, plant, out = gauntlet["run_dir"], gauntlet["plant"], gauntlet["out"]
    collapses = _verdicts(run_dir, "collapse")
    assert collapses, "no collapse verdict\n" + out[-4000:]
    first = collapses[0]
    # within 3 windows of the onset (the onset falls inside a window, which then closes: one more window of slack),
    # judged SETTLE_WINDOWS later (a window waits for the requests that streamed in it to end)
    delay = first["t_unix"] - plant.onset_unix
    assert 0 < delay <= (4 + SETTLE_WINDOWS) * WINDOW_S, f"collapse {delay:.1f} s after the onset"
    # the engine's uptime when it was flagged: the plant's start plus that delay
    assert first["engine_uptime_s"] == pytest.approx(plant.onset_unix - plant.engine_started_unix + delay, abs=3.0)
    assert first["action"] == "stop_config"
    assert first["evidence"]["windows"], "the evidence windows are in the verdict"
    # it explains itself: the engine froze, so its CPU fell with the throughput, each against its own reference
    moves = {m["metric"]: m for m in first["evidence"]["explanation"]["moves"]}
    assert moves["engine_cores"]["moved"] and moves["engine_cores"]["now"] < moves["engine_cores"]["reference"], moves
    assert "at the same time" in first["message"] and "engine CPU cores" in first["message"]
    # the configuration's soak stopped there, not after SOAK_S
    windows = list(read_jsonl(run_dir / WINDOWS))
    assert max(w["t_end_unix"] for w in windows) < plant.onset_unix + (6 + SETTLE_WINDOWS) * WINDOW_S
    assert len({w["engine_pid"] for w in windows}) == 1, "one engine life for every plant"
    manifest = json.loads((run_dir / "manifest.json").read_text())
    soak = manifest["configurations"][CONFIG]["soak"]
    assert soak["status"] == "failed" and soak["first_failure"]["kind"] == "collapse", soak
    assert soak["first_failure"]["engine_uptime_s"] == pytest.approx(first["engine_uptime_s"])
    assert manifest["status"] == "completed_with_failures"
    assert not list(read_jsonl(run_dir / AFTER_SOAK)), "a stopped configuration is not measured again"


def test_planted_collapse_exits_with_the_soak_code_and_the_report_says_when(gauntlet: dict[str, Any]) -> None:
    assert gauntlet["rc"] == EXIT_SOAK, gauntlet["out"][-3000:]
    assert f"soak failed: {CONFIG}" in gauntlet["out"]
    report = (gauntlet["run_dir"] / "report.md").read_text()
    assert "collapse" in report and "engine uptime" in report


def test_collapse_alert_fires_in_a_real_prometheus_scraping_the_run(gauntlet: dict[str, Any]) -> None:
    prom: Prometheus = gauntlet["prom"]
    run = gauntlet["run_dir"].name
    data = prom.api(
        "query_range",
        query=f'ALERTS{{alertname="SpecsoakCollapse", alertstate="firing", run="{run}"}}',
        start=f"{gauntlet['t0']:.3f}",
        end=f"{gauntlet['t1']:.3f}",
        step="1",
    )
    assert _has_data(data["result"]), "SpecsoakCollapse never fired"
    fired_at = min(float(v[0]) for s in data["result"] for v in s["values"])
    assert fired_at >= gauntlet["plant"].onset_unix


def test_every_soak_dashboard_expression_returns_data_for_the_soak(gauntlet: dict[str, Any]) -> None:
    prom: Prometheus = gauntlet["prom"]
    run = gauntlet["run_dir"].name
    windows = list(read_jsonl(gauntlet["run_dir"] / WINDOWS))
    start, end = min(w["t_start_unix"] for w in windows), max(w["t_end_unix"] for w in windows) + 5
    empty = []
    # the soak dashboard, and every other panel or rule that reads a soak-only series (the measured-run test checks the rest)
    # (GPU memory panels: no NVIDIA GPU here; test_gpu_panels_have_data_from_gpu_windows backfills GPU windows for them;
    # open-loop panels: this soak is closed loop; test_open_loop_panels_have_data_from_open_loop_windows backfills them;
    # KV usage and preemptions: llama-server has none; test_engine_view_panels_have_data_from_vllm_windows backfills them)
    exprs = [
        (uid, where, e)
        for uid, where, e in dashboards.all_expressions()
        if dashboards.soak_only(uid, e)
        and not dashboards.gpu_only(e)
        and not dashboards.open_loop_only(e)
        and not dashboards.paged_kv_only(e)
    ]
    assert len([x for x in exprs if x[0] == "specsoak-soak"]) >= 17
    for _uid, where, expr in exprs:
        q = expr.replace("$run", run).replace("$config", ".*").replace("$__rate_interval", "30s")
        data = prom.api("query_range", query=q, start=f"{start:.3f}", end=f"{end:.3f}", step="1")
        if not _has_data(data["result"]):
            empty.append(f"{where}: {q}")
    assert not empty, "soak dashboard expressions without data during the soak:\n" + "\n".join(empty)


def test_a_finished_soak_backfills_its_windows_and_verdicts(gauntlet: dict[str, Any]) -> None:
    from harness.metrics.openmetrics import export_openmetrics

    text = export_openmetrics(gauntlet["run_dir"])
    run = gauntlet["run_dir"].name
    collapsed = [ln for ln in text.splitlines() if ln.startswith("specsoak_soak_collapsed{") and f'run="{run}"' in ln]
    assert any(ln.split()[-2] == "1.0" for ln in collapsed), "the collapse is in the backfill"
    kinds = {"collapse", "stall", "divergence"}
    found = {
        k
        for k in kinds
        for ln in text.splitlines()
        if ln.startswith("specsoak_watchdog_verdicts_total{") and f'kind="{k}"' in ln
    }
    assert found == kinds, found
    assert text.rstrip().endswith("# EOF")
