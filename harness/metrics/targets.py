"""The Prometheus file_sd targets file of a run: the engine being measured, with the run's labels.

``<run folder>/prometheus/engines.json`` lists the engine of the configuration that is running
(one target, labelled run/config/engine/algorithm/synthetic) and is emptied when it stops, so a
Prometheus that reads ``results/*/prometheus/engines.json`` scrapes each engine's own /metrics
while it serves and never alerts on an engine that was stopped on purpose. A target whose engine
serves Prometheus text elsewhere than /metrics says where (``__metrics_path__``). Written atomically.

file_sd globs only the last path element, so the same content is also kept in
``<results root>/prometheus-targets/<run>.json``: one pattern (``prometheus-targets/*.json``)
then covers every run (dashboards/prometheus/prometheus.yml uses it).
"""

from __future__ import annotations

import json
import os
from pathlib import Path
from typing import Any
from urllib.parse import urlsplit

from engines import ENGINES
from harness.records.types import Manifest
from harness.session.observers import BaseObserver

TARGETS_FILE = Path("prometheus") / "engines.json"
SHARED_DIR = "prometheus-targets"


def write_targets(path: Path, groups: list[dict[str, Any]]) -> None:
    path.parent.mkdir(parents=True, exist_ok=True)
    tmp = path.with_name(path.name + ".tmp")
    tmp.write_text(json.dumps(groups, indent=2) + "\n", encoding="utf-8")
    os.replace(tmp, path)


class EngineTargetsFile(BaseObserver):
    """Keeps ``<results_root>/<run>/prometheus/engines.json`` equal to the engine serving now."""

    def __init__(self, results_root: Path):
        self.results_root = results_root
        self.path: Path | None = None
        self.shared_path: Path | None = None
        self._run = ""

    def _write(self, groups: list[dict[str, Any]]) -> None:
        for path in (self.path, self.shared_path):
            if path is not None:
                write_targets(path, groups)

    def on_run_start(self, manifest: Manifest) -> None:
        self._run = manifest.run_id
        self.path = self.results_root / self._run / TARGETS_FILE
        self.shared_path = self.results_root / SHARED_DIR / f"{self._run}.json"
        self._write([])

    def on_config_start(
        self, config: str, algorithm: str, synthetic: bool, engine: str, engine_url: str, engine_pid: int | None
    ) -> None:
        if self.path is None:
            return
        url = urlsplit(engine_url)
        labels = {
            "run": self._run,
            "config": config,
            "engine": engine,
            "algorithm": algorithm,
            "synthetic": "true" if synthetic else "false",
        }
        # each engine's Prometheus text is at its adapter's metrics_path (TensorRT-LLM: /prometheus/metrics;
        # its /metrics is JSON), under the engine URL's own path if it has one
        cls = ENGINES.get(engine)
        path = url.path.rstrip("/") + (cls.metrics_path if cls is not None else "/metrics")
        if path != "/metrics":
            labels["__metrics_path__"] = path
        self._write([{"targets": [url.netloc], "labels": labels}])

    def on_config_end(self, config: str, status: str) -> None:
        self._write([])

    def on_run_end(self, status: str, reason: str) -> None:
        self._write([])
