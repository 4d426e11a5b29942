"""specsoak command line. Exit codes: 0 ok, 1 a verdict failed, 2 bad input, 3 engine/infrastructure."""

from __future__ import annotations

import json
import sys
from pathlib import Path
from typing import Annotated, Optional

import typer
from typer.exceptions import TyperException
from rich.console import Console
from rich.table import Table

from harness.errors import EXIT_ENGINE, EXIT_INPUT, EXIT_OK, HarnessError, ScenarioError

app = typer.Typer(add_completion=False, no_args_is_help=True, help="Is speculative decoding worth it on your box? Measure it.")
out = Console()
err = Console(stderr=True)


def _load(path: Path):  # type: ignore[no-untyped-def]
    from engines import ENGINES
    from harness.scenario import load_scenario

    import yaml

    try:
        engine_name = (yaml.safe_load(path.read_text()) or {}).get("server", {}).get("engine", "llamacpp")
    except Exception:  # noqa: BLE001 - load_scenario reports the real problem
        engine_name = "llamacpp"
    known = ENGINES[engine_name].methods if isinstance(engine_name, str) and engine_name in ENGINES else None
    return load_scenario(path, known)


@app.command()
def run(
    scenario: Annotated[Path, typer.Argument(help="scenario YAML file")],
    results: Annotated[Path, typer.Option(help="folder that receives the run folder")] = Path("results"),
    report: Annotated[bool, typer.Option(help="build the report when the run ends")] = True,
) -> None:
    """Run a scenario on the real engine, write a run folder, print the verdict table."""
    from harness.runner import Runner

    loaded = _load(scenario)
    result = Runner(loaded, results, err).run()
    if report:
        _report([result.run_dir], None)
    if result.failed_configs:
        err.print(f"specsoak: configurations failed: {', '.join(result.failed_configs)} (see {result.run_dir}/failures.jsonl)")
        raise typer.Exit(EXIT_ENGINE)


def _report(run_dirs: list[Path], out_dir: Optional[Path]) -> None:
    from harness.report.build import build_report

    rep = build_report(run_dirs, out_dir)
    if not rep.display.empty:
        table = Table(title="specsoak verdict", show_lines=False)
        for col in rep.display.columns:
            table.add_column(str(col), justify="left" if col in ("configuration", "algorithm", "run") else "right")
        for _, row in rep.display.iterrows():
            table.add_row(*[str(v) for v in row])
        out.print(table)
    out.print(f"report: {rep.markdown}")


@app.command("report")
def report_cmd(
    run_dirs: Annotated[list[Path], typer.Argument(help="one or more run folders")],
    out_dir: Annotated[Optional[Path], typer.Option("--out", help="where to write (default: the run folder)")] = None,
) -> None:
    """Rebuild the report from run folders alone."""
    _report(run_dirs, out_dir)


@app.command()
def validate(scenarios: Annotated[list[Path], typer.Argument(help="scenario YAML files")]) -> None:
    """Check scenario files (fields, ranges, engine methods, model files) without starting anything."""
    for path in scenarios:
        loaded = _load(path)
        sc = loaded.scenario
        out.print(f"{path}: ok: {len(sc.configurations)} configurations ({', '.join(c.name for c in sc.configurations)})")


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
    if not cap.memory_lines_seen:
        t.add_row("memory", "no memory lines: start llama-server with -lv 4 to see them")
    t.add_row("fatal errors", "\n".join(cap.fatal) or "none")
    out.print(t)


@app.command()
def doctor() -> None:
    """Say what is installed, what the engine was built for, and what is missing with the fix."""
    from harness.doctor import run_checks

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
        from harness.runner import RunInterrupted

        if isinstance(exc, RunInterrupted):
            err.print(f"specsoak: interrupted by {exc.signame}; the run folder keeps every record written")
            code = 130 if exc.signame == "SIGINT" else 143
        else:
            raise
    sys.exit(code)


if __name__ == "__main__":
    main()
