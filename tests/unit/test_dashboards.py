"""Generated dashboards: the project's schema holds them, a broken panel fails it, dashboards/ is current."""

from __future__ import annotations

import copy
import json
import re
from collections.abc import Callable
from pathlib import Path
from typing import Any

import pytest
import yaml

from harness.metrics import dashboards as d
from harness.metrics import rules, ruletests
from harness.metrics.dashboard_schema import check_dashboard

ROOT = Path(__file__).resolve().parents[2]
UIDS = {d.DATASOURCE_UID}


@pytest.mark.parametrize("spec", d.DASHBOARDS, ids=lambda s: s.uid)
def test_every_dashboard_fits_the_schema(spec: d.DashboardSpec) -> None:
    dash = d.build_dashboard(spec)
    assert check_dashboard(dash, UIDS) == []
    assert dash["schemaVersion"] >= 41, "built for Grafana 11.6 or later"


def _first_target(dash: dict[str, Any]) -> dict[str, Any]:
    return dash["panels"][0]["targets"][0]


BREAKS: dict[str, Callable[[dict[str, Any]], None]] = {
    "duplicate panel id": lambda j: j["panels"][1].update(id=j["panels"][0]["id"]),
    "panel without targets": lambda j: j["panels"][0].update(targets=[]),
    "empty expression": lambda j: _first_target(j).update(expr=" "),
    "unknown datasource uid": lambda j: _first_target(j).update(datasource={"type": "prometheus", "uid": "typo"}),
    "panel without datasource": lambda j: j["panels"][0].pop("datasource"),
    "non-prometheus datasource": lambda j: j["panels"][0].update(datasource={"type": "loki", "uid": d.DATASOURCE_UID}),
    "duplicate refId": lambda j: j["panels"][0]["targets"].append(copy.deepcopy(_first_target(j))),
    "bad refId": lambda j: _first_target(j).update(refId=""),
    "unknown panel type": lambda j: j["panels"][0].update(type="graph"),
    "panel without title": lambda j: j["panels"][0].update(title=""),
    "annotation on another datasource": lambda j: j["annotations"]["list"][0].update(
        datasource={"type": "prometheus", "uid": "other"}
    ),
    "variable that is not label_values": lambda j: j["templating"]["list"][0].update(query="up"),
    "gridPos wider than the dashboard": lambda j: j["panels"][0]["gridPos"].update(w=30),
}


@pytest.mark.parametrize("name", sorted(BREAKS))
def test_a_broken_panel_fails_the_check(name: str) -> None:
    dash = d.build_dashboard(d.SOAK)
    assert check_dashboard(dash, UIDS) == []
    BREAKS[name](dash)
    assert check_dashboard(dash, UIDS), f"{name} passed the check"


def test_committed_files_are_what_the_code_generates() -> None:
    stale = [
        rel
        for rel, text in d.generated_files().items()
        if not (ROOT / "dashboards" / rel).is_file() or (ROOT / "dashboards" / rel).read_text() != text
    ]
    assert not stale, f"dashboards/ is stale, run `specsoak dashboards`: {stale}"


def test_committed_dashboards_fit_the_schema() -> None:
    files = sorted((ROOT / "dashboards" / "grafana" / "dashboards").glob("*.json"))
    assert len(files) == len(d.DASHBOARDS)
    provisioned = yaml.safe_load((ROOT / "dashboards/grafana/provisioning/datasources/specsoak.yml").read_text())
    uids = {ds["uid"] for ds in provisioned["datasources"]}
    for f in files:
        assert check_dashboard(json.loads(f.read_text()), uids) == [], f.name


def test_every_expression_in_the_json_is_in_all_expressions() -> None:
    """The live integration test evaluates all_expressions(); nothing a dashboard shows escapes it."""
    known = {expr for _uid, _where, expr in d.all_expressions()}
    for spec in d.DASHBOARDS:
        dash = d.build_dashboard(spec)
        exprs = [t["expr"] for p in dash["panels"] for t in p["targets"]] + [
            a["expr"] for a in dash["annotations"]["list"]
        ]
        exprs += [d.variable_selector(v["query"]) for v in dash["templating"]["list"]]
        assert set(exprs) <= known, set(exprs) - known


def test_compose_file_points_at_files_that_exist() -> None:
    compose = yaml.safe_load((ROOT / "dashboards" / "docker-compose.yml").read_text())
    assert set(compose["services"]) == {"prometheus", "grafana"}
    for svc in compose["services"].values():
        assert svc["network_mode"] == "host"
        for vol in svc["volumes"]:
            src = vol.split(":")[0]
            if src.startswith("."):
                assert (ROOT / "dashboards" / src).exists(), src
    prom = yaml.safe_load((ROOT / "dashboards/prometheus/prometheus.yml").read_text())
    assert prom["scrape_configs"][0]["static_configs"][0]["targets"] == [f"127.0.0.1:{d.EXPORTER_PORT}"]


def test_cli_dashboards_regenerates_everything(tmp_path: Path) -> None:
    import subprocess
    import sys

    proc = subprocess.run(
        [sys.executable, "-c", "from harness.cli import main; main()", "dashboards", "--out", str(tmp_path)],
        capture_output=True,
        text=True,
        timeout=120,
        check=False,
    )
    assert proc.returncode == 0, proc.stderr
    for rel, text in d.generated_files().items():
        assert (tmp_path / rel).read_text() == text, rel


def test_dashboards_read_the_engines_only_through_the_engine_neutral_rules() -> None:
    raw = re.compile(r"(?<![\w:])(llamacpp:|vllm:|sglang:|trtllm_|tgi_)")
    for uid, where, expr in d.all_expressions():
        if not uid.startswith("rules"):
            assert not raw.search(expr), f"{uid}: {where} reads an engine's own series: {expr}"
    engine_panels = {
        p.title for spec in d.DASHBOARDS for p in spec.panels if any(rules.engine_outputs_in(q.expr) for q in p.queries)
    }
    read = set().union(*(rules.engine_outputs_in(e) for _u, _w, e in d.all_expressions() if not _u.startswith("rules")))
    assert read == {o.record for o in rules.ENGINE_OUTPUTS}, "every engine-neutral series is on a panel"
    assert len(engine_panels) >= 4


def test_each_engine_has_a_rule_test_of_every_output_it_reports() -> None:
    first: dict[str, set[str]] = {}
    for t in ruletests.engine_rule_tests():
        engine = t["name"].removeprefix("engine series: ").split(",")[0]
        expected = {x["expr"].split("{")[0] for x in t["promql_expr_test"] if x["exp_samples"]}
        first.setdefault(engine, expected)
        assert len(t["promql_expr_test"]) == len(rules.ENGINE_OUTPUTS), "every output: a value or none"
    assert first == {e: set(series) for e, series in rules.ENGINE_SERIES.items()}
