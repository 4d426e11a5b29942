"""The strict check of generated dashboards: the project's JSON schema plus what a schema cannot say.

``check_dashboard`` returns every problem as one line naming the dashboard and the JSON path;
an empty list means the dashboard is fit to provision.
"""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import jsonschema

SCHEMA_PATH = Path(__file__).resolve().parents[2] / "dashboards" / "schema" / "dashboard.schema.json"


def load_schema(path: Path = SCHEMA_PATH) -> dict[str, Any]:
    data: dict[str, Any] = json.loads(path.read_text(encoding="utf-8"))
    jsonschema.Draft202012Validator.check_schema(data)
    return data


def _datasources(dash: dict[str, Any]) -> list[tuple[str, Any]]:
    found: list[tuple[str, Any]] = []
    for i, p in enumerate(dash.get("panels") or []):
        found.append((f"panels[{i}].datasource", p.get("datasource")))
        for j, t in enumerate(p.get("targets") or []):
            found.append((f"panels[{i}].targets[{j}].datasource", t.get("datasource")))
    for key in ("templating", "annotations"):
        for i, item in enumerate((dash.get(key) or {}).get("list") or []):
            found.append((f"{key}.list[{i}].datasource", item.get("datasource")))
    return found


def check_dashboard(dash: dict[str, Any], datasource_uids: set[str], schema: dict[str, Any] | None = None) -> list[str]:
    name = dash.get("uid") or dash.get("title") or "dashboard"
    validator = jsonschema.Draft202012Validator(schema or load_schema())
    errors = [
        f"{name}: {'/'.join(str(p) for p in e.absolute_path) or '(root)'}: {e.message}"
        for e in sorted(validator.iter_errors(dash), key=lambda e: list(map(str, e.absolute_path)))
    ]
    ids: dict[Any, int] = {}
    for i, p in enumerate(dash.get("panels") or []):
        pid = p.get("id")
        if pid in ids:
            errors.append(f"{name}: panels/{i}/id: {pid} is also the id of panels/{ids[pid]}")
        else:
            ids[pid] = i
        refs = [t.get("refId") for t in p.get("targets") or []]
        dup = sorted({r for r in refs if refs.count(r) > 1 and r is not None})
        if dup:
            errors.append(f"{name}: panels/{i}/targets: refId {', '.join(dup)} used more than once")
    for where, ds in _datasources(dash):
        uid = ds.get("uid") if isinstance(ds, dict) else None
        if uid not in datasource_uids:
            errors.append(
                f"{name}: {where}: datasource uid {uid!r} is not a provisioned datasource ({', '.join(sorted(datasource_uids))})"
            )
    return errors
