"""specsoak command line. Exit codes: 0 ok, 1 a verdict failed, 2 bad input, 3 engine/infrastructure, 4 a soak failed."""

from __future__ import annotations

import json
import os
import sys
from pathlib import Path
from typing import TYPE_CHECKING, Annotated, Any

import typer
from rich.console import Console
from rich.table import Table
from typer.exceptions import TyperException

from harness.common.errors import EXIT_ENGINE, EXIT_INPUT, EXIT_OK, EXIT_SOAK, EXIT_VERDICT, HarnessError, ScenarioError

if TYPE_CHECKING:  # imported where used: `specsoak --help` stays quick
    from harness.config.loader import LoadedScenario
    from harness.run.runner import RunResult

app = typer.Typer(
    add_completion=False, no_args_is_help=True, help="Is speculative decoding worth it on your box? Measure it."
)
# soft_wrap: a message is never cut inside a path (logs and pipes get whole lines); a table printed to a
# pipe or a log file gets 200 columns instead of rich's 80, where the verdict's 16 columns are unreadable
_PIPE_WIDTH = None if sys.stdout.isatty() or os.environ.get("COLUMNS") else 200
out = Console(soft_wrap=True, width=_PIPE_WIDTH)
err = Console(stderr=True, soft_wrap=True)

# options that run, resume and report share
ReportOption = Annotated[bool, typer.Option(help="build the report when the run ends")]
MetricsPortOption = Annotated[
    int | None, typer.Option(help="serve Prometheus /metrics on this port while the run goes (0 = any free port)")
]
MetricsLingerOption = Annotated[
    float, typer.Option(help="seconds /metrics keeps serving after the run, for the last scrape")
]
WideOption = Annotated[
    bool,
    typer.Option("--wide", help="print every column of the verdict (the report's table) instead of the compact one"),
]


def _load(path: Path, check_model_files: bool = True) -> LoadedScenario:
    import yaml

    from engines import ENGINES
    from harness.config.loader import load_scenario

    try:
        engine_name = (yaml.safe_load(path.read_text()) or {}).get("server", {}).get("engine", "llamacpp")
    except Exception:
        engine_name = "llamacpp"
    cls = ENGINES[engine_name] if isinstance(engine_name, str) and engine_name in ENGINES else None
    known = cls.methods if cls is not None else None
    folders = bool(cls is not None and cls.model_folders)
    return load_scenario(path, known, check_model_files=check_model_files, model_folders=folders)


@app.command()
def run(
    scenario: Annotated[Path, typer.Argument(help="scenario YAML file")],
    results: Annotated[Path, typer.Option(help="folder that receives the run folder")] = Path("results"),
    report: ReportOption = True,
    metrics_port: MetricsPortOption = None,
    metrics_host: Annotated[
        str, typer.Option(help="address the /metrics server binds (anything but loopback is your explicit choice)")
    ] = "127.0.0.1",
    metrics_linger: MetricsLingerOption = 10.0,
    wide: WideOption = False,
    soak: Annotated[
        bool, typer.Option(help="run the scenario's soak (--no-soak: the measurement only, a campaign's measure Job)")
    ] = True,
    soak_config: Annotated[
        list[str] | None,
        typer.Option(help="soak only this configuration (repeatable): a campaign's soak Job (docs/fleet.md)"),
    ] = None,
) -> None:
    """Run a scenario on the real engine, write a run folder, print the verdict table."""
    from harness.config.parts import campaign_part

    loaded = campaign_part(_load(scenario), soak, soak_config or [])
    result = _run_observed(loaded, results, metrics_port, metrics_host, metrics_linger)
    if report:
        _report([result.run_dir], None, wide=wide)
    raise typer.Exit(_exit_code(result))


def _exit_code(result: RunResult) -> int:
    """3 when a configuration could not be measured, else 4 when a soak failed, else 0 (the README's table)."""
    if result.failed_configs:
        err.print(
            f"specsoak: configurations failed: {', '.join(result.failed_configs)} (see {result.run_dir}/failures.jsonl)"
        )
    if result.soak_failures:
        err.print(
            f"specsoak: soak failed: {', '.join(result.soak_failures)} (crash, hang, collapse or memory: see {result.run_dir}/verdicts.jsonl)"
        )
    if result.failed_configs:
        return EXIT_ENGINE
    return EXIT_SOAK if result.soak_failures else EXIT_OK


@app.command()
def resume(
    run_dir: Annotated[Path, typer.Argument(help="a run folder cut short (harness killed, power loss, SIGTERM)")],
    report: ReportOption = True,
    metrics_port: MetricsPortOption = None,
    metrics_host: Annotated[
        str, typer.Option(help="address /metrics binds to; anything but loopback exposes it")
    ] = "127.0.0.1",
    metrics_linger: MetricsLingerOption = 10.0,
    wide: WideOption = False,
) -> None:
    """Finish a run that was cut short: measured phases and soak time are kept, the rest is run."""
    from harness.common.errors import ResultsError
    from harness.records.files import read_manifest

    try:
        manifest = read_manifest(run_dir)
    except ResultsError as exc:
        raise ScenarioError(str(exc)) from None  # not a run folder: bad input, exit 2
    code = EXIT_OK
    if manifest.status in ("completed", "completed_with_failures", "stopped_by_verdict"):
        err.print(f"specsoak: {run_dir} is already complete ({manifest.status}); nothing to resume")
    else:
        copy = run_dir / "scenario.yaml"
        original = Path(manifest.scenario_file or "")
        # the original file resolves relative model paths; the copy is what was run
        same = original.is_file() and copy.is_file() and original.read_text() == copy.read_text()
        loaded = _load(original if same else copy)
        result = _run_observed(loaded, run_dir.parent, metrics_port, metrics_host, metrics_linger, resume_dir=run_dir)
        code = _exit_code(result)
    if report:
        _report([run_dir], None, wide=wide)
    raise typer.Exit(code)


def _run_observed(
    loaded: LoadedScenario,
    results: Path,
    metrics_port: int | None,
    metrics_host: str,
    linger_s: float,
    resume_dir: Path | None = None,
) -> RunResult:
    """The run with its observers: the engines' file_sd targets file always, the exporter when asked."""
    import time

    from harness.metrics.targets import EngineTargetsFile
    from harness.run.runner import Runner

    observers: list[Any] = [EngineTargetsFile(results)]
    exporter = None
    if metrics_port is not None:
        from harness.metrics.exporter import MetricsExporter

        try:
            exporter = MetricsExporter(metrics_host, metrics_port).start()
        except OSError as exc:
            raise ScenarioError(
                f"--metrics-port {metrics_port}: cannot serve on {metrics_host}: {exc.strerror}"
            ) from None
        err.print(f"specsoak: Prometheus metrics at {exporter.url}")
        observers.append(exporter)
    try:
        result = Runner(loaded, results, err, observers=observers).run(resume_dir=resume_dir)
        if exporter is not None and linger_s > 0:
            time.sleep(linger_s)
        return result
    finally:
        if exporter is not None:
            exporter.close()


def _width() -> int:
    """The terminal's width, or 100 columns when stdout is not a terminal (a log file, a pipe)."""
    import shutil

    return shutil.get_terminal_size((100, 24)).columns if sys.stdout.isatty() else int(os.environ.get("COLUMNS") or 100)


def _report(
    run_dirs: list[Path],
    out_dir: Path | None,
    slo: dict | None = None,
    memory_budget_mib: float | None = None,
    wide: bool = False,
) -> None:
    from harness.report.build import build_report
    from harness.report.console import console_lines

    rep = build_report(run_dirs, out_dir, slo=slo, memory_budget_mib=memory_budget_mib)
    for problem in rep.read_problems:
        err.print(f"specsoak: could not read {problem}", markup=False, highlight=False, soft_wrap=True)
    if not wide and not rep.verdict.empty:
        for line in console_lines(rep.verdict, _width()):
            out.print(line, markup=False, highlight=False, soft_wrap=True)
    elif not rep.display.empty:
        table = Table(title="specsoak verdict", show_lines=False)
        for col in rep.display.columns:
            table.add_column(str(col), justify="left" if col in ("configuration", "algorithm", "run") else "right")
        for _, row in rep.display.iterrows():
            table.add_row(*[str(v) for v in row])
        out.print(table)
    out.print(f"report: {rep.markdown}")
    if rep.html is not None:
        out.print(f"report: {rep.html}")


@app.command("report")
def report_cmd(
    run_dirs: Annotated[list[Path], typer.Argument(help="one or more run folders")],
    out_dir: Annotated[Path | None, typer.Option("--out", help="where to write (default: the run folder)")] = None,
    slo_tps: Annotated[
        float | None, typer.Option(help="SLO: per-stream decode t/s at least (instead of the scenario's slo:)")
    ] = None,
    slo_ttft_p95: Annotated[
        float | None, typer.Option(help="SLO: TTFT p95 in seconds at most (instead of the scenario's slo:)")
    ] = None,
    memory_budget_mib: Annotated[
        float | None,
        typer.Option(
            help="memory budget for the servable context (instead of the scenario's report.memory_budget_mib)"
        ),
    ] = None,
    wide: WideOption = False,
) -> None:
    """Rebuild the report (md, html, tables, plots) from run folders alone."""
    for d in run_dirs:
        if not (d / "manifest.json").is_file():
            raise ScenarioError(f"{d}: not a run folder (no manifest.json)")
    slo = {"per_stream_tps_min": slo_tps, "ttft_p95_s_max": slo_ttft_p95} if slo_tps or slo_ttft_p95 else None
    _report(run_dirs, out_dir, slo, memory_budget_mib, wide=wide)


@app.command()
def compare(
    run_a: Annotated[Path, typer.Argument(help="a run folder")],
    run_b: Annotated[Path, typer.Argument(help="another run folder of the same scenario")],
    out_dir: Annotated[Path | None, typer.Option("--out", help="also write compare.csv and compare.md here")] = None,
) -> None:
    """Two runs side by side: per configuration and ratio, whether each lies inside the other's 95% interval.

    Exit 0 when every ratio with intervals agrees, 1 when one does not (the verdict did not hold)."""
    from harness.report.design import compare_summary, compare_table
    from harness.report.load import load_run
    from harness.report.verdict import verdict_table

    for d in (run_a, run_b):
        if not (d / "manifest.json").is_file():
            raise ScenarioError(f"{d}: not a run folder (no manifest.json)")
    a, b = load_run(run_a), load_run(run_b)
    if a.manifest.scenario != b.manifest.scenario:
        err.print(
            f"[yellow]specsoak: the runs are of different scenarios ({a.manifest.scenario}, {b.manifest.scenario})[/]"
        )
    cmp = compare_table(verdict_table([a]), verdict_table([b]))
    summary = compare_summary(cmp)
    import pandas as pd

    from harness.report.console import render

    columns = ("configuration", "ratio", "run A [95% CI]", "run B [95% CI]", "B / A", "agree")
    rows_md, cells_all = [], []
    for _, r in cmp.iterrows():
        cells = [
            str(r["config"]),
            str(r["figure"]),
            _ci(r["run_a"], r["run_a_ci_low"], r["run_a_ci_high"]),
            _ci(r["run_b"], r["run_b_ci_low"], r["run_b_ci_high"]),
            f"{r['difference']:+.1%}",
            "–" if r["agree"] is None else "✓" if r["agree"] else "✗",
        ]
        cells_all.append(cells)
        rows_md.append("| " + " | ".join(cells) + " |")
    out.print(f"{a.run_id}  vs  {b.run_id}", markup=False, highlight=False, soft_wrap=True)
    for ln in render(pd.DataFrame(cells_all, columns=list(columns)), _width()):
        out.print(ln, markup=False, highlight=False, soft_wrap=True)
    med = summary["median_abs_difference"]
    line = (
        f"{summary['agree']} of {summary['figures']} ratios agree (each inside the other run's 95% interval), "
        f"{summary['disagree']} do not, {summary['no_interval']} without interval; median |B / A − 1| = "
        + (f"{med:.1%}" if med is not None else "–")
    )
    out.print(line)
    if out_dir is not None:
        out_dir.mkdir(parents=True, exist_ok=True)
        cmp.to_csv(out_dir / "compare.csv", index=False)
        head = (
            "| configuration | ratio | run A [95% CI] | run B [95% CI] | B / A | agree |\n|---|---|---|---|---|---|\n"
        )
        (out_dir / "compare.md").write_text(
            f"# {a.run_id} vs {b.run_id}\n\n{head}" + "\n".join(rows_md) + f"\n\n{line}\n", encoding="utf-8"
        )
    raise typer.Exit(EXIT_VERDICT if summary["disagree"] else EXIT_OK)


def _ci(v: float, lo: object, hi: object) -> str:
    from harness.common.stats import isnum

    return f"{v:.2f}× [{lo:.2f}, {hi:.2f}]" if isnum(lo) and isnum(hi) else f"{v:.2f}× [–]"


@app.command()
def verify(
    scenario: Annotated[Path, typer.Argument(help="scenario YAML file (its baseline and speculative configurations)")],
    results: Annotated[Path, typer.Option(help="folder that receives the verify run folder")] = Path("results"),
    into: Annotated[Path | None, typer.Option(help="write into this existing run folder instead of a new one")] = None,
    streams: Annotated[
        int | None, typer.Option(help="the concurrent stream count (default: the scenario's largest)", min=1)
    ] = None,
    prompts: Annotated[int, typer.Option(help="how many of the scenario's prompts", min=1)] = 4,
    max_tokens: Annotated[
        int | None, typer.Option(help="tokens per answer (default: the scenario's max_tokens)", min=1)
    ] = None,
    samples: Annotated[
        int, typer.Option(help="sampled answers per configuration for the distribution test (0: none)", min=0)
    ] = 0,
    temperature: Annotated[float, typer.Option(help="temperature of the distribution test's samples", min=0.01)] = 0.8,
    config: Annotated[list[str] | None, typer.Option(help="only these configurations (repeatable)")] = None,
    report: Annotated[bool, typer.Option(help="build the report of the folder afterwards")] = True,
) -> None:
    """Compare speculative outputs with the baseline's: greedy token by token, sampled by a chi-square test."""
    from harness.run.verify import Verifier, VerifyOptions

    loaded = _load(scenario)
    opts = VerifyOptions(
        streams=streams,
        prompts=prompts,
        max_tokens=max_tokens,
        samples=samples,
        temperature=temperature,
        configurations=list(config or []),
    )
    run_dir, identical = Verifier(loaded, results, opts, err, into=into).run()
    if report:
        _report([run_dir], None)
    out.print(
        "verify: "
        + (
            "every configuration gave the baseline's outputs"
            if identical
            else "outputs DIFFER from the baseline (see verify.jsonl)"
        )
    )
    if not identical:
        raise typer.Exit(EXIT_VERDICT)


@app.command()
def validate(
    scenarios: Annotated[list[Path], typer.Argument(help="scenario YAML files")],
    no_model_files: Annotated[
        bool, typer.Option("--no-model-files", help="check everything but the existence of model files (GPU scenarios)")
    ] = False,
) -> None:
    """Check scenario files (fields, ranges, engine methods, model files) without starting anything."""
    from engines import ENGINES
    from harness.config.checks import soak_warnings
    from harness.config.estimate import ASSUMED_STREAM_TPS, describe_duration, design_warnings, wall_clock_estimate
    from harness.soak.disk import describe_estimate, disk_warnings

    for path in scenarios:
        loaded = _load(path, check_model_files=not no_model_files)
        sc = loaded.scenario
        out.print(f"{path}: ok: {len(sc.runs())} configurations ({', '.join(c.name for c in sc.runs())})")
        est = wall_clock_estimate(sc)
        parts = [
            f"{k.removesuffix('_s').replace('_', ' ')} {describe_duration(v)}"
            for k, v in est.items()
            if k != "total_s" and v > 0
        ]
        out.print(
            f"{path}: estimated wall clock {describe_duration(est['total_s'])} ({', '.join(parts)}; phases at an assumed "
            f"{ASSUMED_STREAM_TPS:g} t/s per stream, the soak exactly)",
            highlight=False,
        )
        out.print(f"{path}: {describe_estimate(sc)}", highlight=False)
        for warning in design_warnings(sc) + soak_warnings(sc) + disk_warnings(sc, Path("results")):
            err.print(f"{path}: warning: {warning}", markup=False, highlight=False, soft_wrap=True)
        for cfg in sc.runs():
            for warning in ENGINES[sc.server.engine].validate_warnings(cfg, sc.server):
                err.print(f"{path}: warning: {cfg.name}: {warning}", markup=False, highlight=False, soft_wrap=True)


@app.command()
def plan(scenarios: Annotated[list[Path], typer.Argument(help="scenario YAML files")]) -> None:
    """What a run would do: each configuration's engine command line, the phases in order, the wall-clock estimate.
    Starts nothing; model files that are not here are reported, not fatal."""
    from engines import ENGINES
    from harness.run.plan import plan_lines

    for i, path in enumerate(scenarios):
        loaded = _load(path, check_model_files=False)
        if i:
            out.print()
        for line in plan_lines(loaded, ENGINES[loaded.scenario.server.engine]):
            out.print(line, markup=False, highlight=False)


@app.command()
def schema(
    markdown: Annotated[
        bool, typer.Option("--markdown", help="docs/scenarios.md: every field, its unit, default, range and engines")
    ] = False,
) -> None:
    """The JSON Schema of a scenario file (for editors), or with --markdown the scenario reference."""
    if markdown:
        from harness.config.reference import markdown as scenario_markdown

        sys.stdout.write(scenario_markdown())
    else:
        from harness.config.schema import Scenario

        sys.stdout.write(json.dumps(Scenario.model_json_schema(), indent=2) + "\n")


@app.command("inspect-log")
def inspect_log(
    log: Annotated[Path, typer.Argument(help="an engine start-up log")],
    engine: Annotated[str, typer.Option(help="which engine wrote it")] = "llamacpp",
    as_json: Annotated[bool, typer.Option("--json", help="print JSON")] = False,
) -> None:
    """Print the capacity a start-up log reveals: the only truth about parallelism."""
    from engines import ENGINES

    if engine not in ENGINES:
        raise ScenarioError(f"--engine: unknown engine '{engine}'; known: {', '.join(sorted(ENGINES))}")
    try:
        text = log.read_text(encoding="utf-8", errors="replace")
    except OSError as exc:
        raise ScenarioError(f"{log}: cannot read ({exc.strerror})") from None
    cls = ENGINES[engine]
    cap = cls.parse_startup_log(text)
    if not cap.recognised() and cls.failure_reason(text) is None:
        others = [
            name
            for name, other in sorted(ENGINES.items())
            if name != engine and other.parse_startup_log(text).recognised()
        ]
        hint = f"; is this a {others[0]} log? try --engine {others[0]}" if others else ""
        raise ScenarioError(f"{log}: no {engine} start-up lines found{hint}")
    data = cap.to_dict()
    data["failure_reason"] = cls.failure_reason(text)
    if as_json:
        out.print_json(json.dumps(data))
        return
    t = Table(title=f"{log.name} ({engine})", show_header=False)
    t.add_column("what")
    t.add_column("value")
    t.add_row("slots", str(cap.slots))
    t.add_row("context per slot", str(cap.ctx_per_slot))
    t.add_row("context total", str(cap.ctx_total))
    t.add_row("KV unified", str(cap.kv_unified))
    for label, mem in (("target", cap.target), ("draft", cap.draft)):
        if mem is None:
            continue
        t.add_row(f"{label} model MiB", str(mem.model_mib))
        t.add_row(f"{label} KV MiB", str(mem.kv_mib))
        t.add_row(f"{label} compute MiB", str(mem.compute_mib))
        if mem.recurrent_mib is not None:
            t.add_row(f"{label} recurrent state MiB / cells", f"{mem.recurrent_mib} / {mem.recurrent_cells}")
    t.add_row("speculative types", ", ".join(cap.spec_types) or "none")
    t.add_row("draft n_max", str(cap.spec_n_max))
    if cap.synthetic:
        t.add_row("synthetic acceptance", cap.synthetic)
    if cap.max_concurrency is not None:
        t.add_row("max concurrency at ctx/slot", f"{cap.max_concurrency:g}")
    if cap.kv_blocks is not None:
        t.add_row("KV blocks x tokens", f"{cap.kv_blocks} x {cap.kv_block_tokens}")
    if not cap.memory_lines_seen:
        hint = "start llama-server with -lv 4 to see them" if engine == "llamacpp" else "this log has none"
        t.add_row("memory", f"no memory lines: {hint}")
    t.add_row("fatal errors", "\n".join(cap.fatal) or "none")
    for note in cap.notes:
        t.add_row("note", note)
    out.print(t)


@app.command()
def worker(
    master: Annotated[
        str, typer.Option(help="HOST:PORT of the soak's Locust master (soak.remote_workers bind and port)")
    ],
    processes: Annotated[
        int, typer.Option(help="Locust worker processes on this host (about one per core)", min=1)
    ] = 1,
) -> None:
    """Locust workers on this host for a soak whose master runs in the harness elsewhere (soak.remote_workers);
    they take each slice's config from the master and send their records back. Ctrl-C stops them."""
    from harness.load.locust_proc import run_workers

    host, sep, port = master.rpartition(":")
    if not sep or not host or not port.isdigit() or not 0 < int(port) < 65536:
        raise typer.BadParameter(f"--master {master!r}: expected HOST:PORT, e.g. 10.0.0.1:5557")
    out.print(f"specsoak worker: {processes} Locust worker(s) for the master at {host}:{port}; Ctrl-C stops them")
    raise typer.Exit(run_workers(host.strip("[]"), int(port), processes, say=err.print))


@app.command()
def k8s(
    scenario: Annotated[Path, typer.Argument(help="scenario YAML file")],
    out_dir: Annotated[Path, typer.Option("--out", help="folder for the manifests (created)")],
    image: Annotated[str, typer.Option(help="container image holding specsoak and the engine")],
    results_claim: Annotated[
        str, typer.Option(help="PersistentVolumeClaim every pod mounts at /results (ReadWriteMany across nodes)")
    ],
    namespace: Annotated[str, typer.Option(help="namespace of every object")] = "default",
    gpus: Annotated[int, typer.Option(help="GPUs per pod (nvidia.com/gpu); 0 for a CPU campaign", min=0)] = 1,
    node_selector: Annotated[
        list[str] | None, typer.Option(help="KEY=VALUE a node must carry (repeatable), e.g. a GPU product label")
    ] = None,
    api_key_secret: Annotated[
        str | None, typer.Option(help="Secret whose key 'api-key' is the engine's key (server.api_key_env)")
    ] = None,
) -> None:
    """Write a campaign's Kubernetes manifests: the measurement as one Job on one node, each soak its own Job on its
    own node, the scrape for Prometheus (docs/fleet.md)."""
    import yaml

    from harness.fleet.k8s import Campaign, manifests, scrape_config, service_monitor

    loaded = _load(scenario, check_model_files=False)
    selector: dict[str, str] = {}
    for item in node_selector or []:
        key, sep, value = item.partition("=")
        if not sep or not key:
            raise ScenarioError(f"--node-selector {item!r}: give KEY=VALUE")
        selector[key] = value
    c = Campaign(image, results_claim, namespace, gpus, selector, api_key_secret, scenario.name)
    docs = manifests(loaded, c)
    out_dir.mkdir(parents=True, exist_ok=True)
    dump = lambda d: yaml.safe_dump(d, sort_keys=False, allow_unicode=True)
    for name, doc in docs.items():
        (out_dir / name).write_text(dump(doc))
    (out_dir / "kustomization.yaml").write_text(
        dump({"apiVersion": "kustomize.config.k8s.io/v1beta1", "kind": "Kustomization", "resources": list(docs)})
    )
    (out_dir / "servicemonitor.yaml").write_text(dump(service_monitor(loaded, c)))
    (out_dir / "prometheus-scrape.yaml").write_text(dump(scrape_config(loaded, c)))
    jobs = [n for n in docs if n.endswith("-job.yaml")]
    out.print(
        f"specsoak: {len(docs)} manifests in {out_dir} ({len(jobs)} Jobs: the measurement and {len(jobs) - 1} soaks)"
    )
    out.print(f"  kubectl apply -k {out_dir}")
    out.print(
        f"  kubectl apply -f {out_dir / 'servicemonitor.yaml'}   (Prometheus Operator; else {out_dir / 'prometheus-scrape.yaml'})"
    )
    out.print(f"  then: specsoak report <the folders under each part on {results_claim}> (docs/fleet.md)")


@app.command()
def dashboards(
    out_dir: Annotated[Path, typer.Option("--out", help="where to write (default: dashboards/)")] = Path("dashboards"),
) -> None:
    """Regenerate the Grafana dashboards, provisioning, prometheus.yml, rules, rule tests, docker-compose.yml."""
    from harness.metrics.dashboard_schema import check_dashboard
    from harness.metrics.dashboards import DASHBOARDS, DATASOURCE_UID, build_dashboard, write_all

    problems = [p for spec in DASHBOARDS for p in check_dashboard(build_dashboard(spec), {DATASOURCE_UID})]
    if problems:
        raise HarnessError("generated dashboards fail dashboards/schema: " + "; ".join(problems))
    for path in write_all(out_dir):
        out.print(str(path))


@app.command("export")
def export_cmd(
    run_dir: Annotated[Path, typer.Argument(help="a run folder")],
    openmetrics: Annotated[
        bool,
        typer.Option(
            "--openmetrics",
            help="OpenMetrics text for `promtool tsdb create-blocks-from openmetrics` (the only format)",
        ),
    ] = False,
    out_file: Annotated[Path | None, typer.Option("--out", help="file to write (default: stdout)")] = None,
    step: Annotated[
        float, typer.Option(help="also repeat every series each STEP seconds (0: only when it changes)")
    ] = 15.0,
) -> None:
    """Write a finished run's series, timestamped, for Prometheus backfill."""
    from harness.metrics.openmetrics import export_openmetrics

    if not openmetrics:
        raise ScenarioError("export: say the format: --openmetrics")
    if not (run_dir / "manifest.json").is_file():
        raise ScenarioError(f"{run_dir}: not a run folder (no manifest.json)")
    text = export_openmetrics(run_dir, step)
    if out_file is None:
        sys.stdout.write(text)
        return
    try:
        out_file.write_text(text, encoding="utf-8")
    except OSError as exc:
        raise ScenarioError(f"--out {out_file}: cannot write ({exc.strerror})") from None
    err.print(
        f"specsoak: wrote {out_file}; load it with: promtool tsdb create-blocks-from openmetrics {out_file} DATA_DIR"
    )


@app.command()
def doctor() -> None:
    """Say what is installed, what the engine was built for, and what is missing with the fix."""
    from harness.setup.doctor import run_checks

    checks = run_checks()
    t = Table(title="specsoak doctor")
    for col in ("check", "status", "detail", "fix"):
        t.add_column(col)
    for c in checks:
        status = "ok" if c.ok else ("MISSING" if c.required else "optional, missing")
        t.add_row(c.name, status, c.detail, "" if c.ok else c.fix)
    out.print(t)
    if any(not c.ok and c.required for c in checks):
        raise typer.Exit(EXIT_ENGINE)


def main() -> None:
    # the user's umask, but never group- or world-writable: run folders, logs and records (docs/reliability.md)
    os.umask(os.umask(0o022) | 0o022)
    try:
        rv = app(standalone_mode=False)
        code = rv if isinstance(rv, int) else EXIT_OK
    except HarnessError as exc:
        err.print(f"specsoak: error: {exc}", markup=False, highlight=False, soft_wrap=True)
        code = exc.exit_code
    except typer.Exit as exc:
        code = exc.exit_code
    except TyperException as exc:
        show = getattr(exc, "show", None)
        if callable(show):
            show()
        else:
            err.print(f"specsoak: error: {exc.format_message()}", markup=False, highlight=False, soft_wrap=True)
        code = EXIT_INPUT
    except typer.Abort:
        code = 130
    except KeyboardInterrupt:
        code = 130
    except BaseException as exc:
        from harness.run.interrupt import RunInterrupted

        if isinstance(exc, RunInterrupted):
            err.print(f"specsoak: interrupted by {exc.signame}; the run folder keeps every record written")
            code = 130 if exc.signame == "SIGINT" else 143
        else:
            raise
    sys.exit(code)


if __name__ == "__main__":
    main()
