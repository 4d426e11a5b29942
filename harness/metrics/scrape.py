"""prometheus.yml: the scrape jobs of the exporter and of every engine a run lists in its file_sd targets."""

from __future__ import annotations

from typing import Any

EXPORTER_JOB = "specsoak"
ENGINES_JOB = "specsoak-engines"


def prometheus_config(
    exporter_targets: list[str],
    engine_sd_files: list[str],
    rule_files: list[str],
    scrape_interval: str = "5s",
    evaluation_interval: str | None = None,
    sd_refresh: str = "5s",
) -> dict[str, Any]:
    """prometheus.yml: the exporter, and every engine listed in the runs' file_sd targets files."""
    return {
        "global": {"scrape_interval": scrape_interval, "evaluation_interval": evaluation_interval or scrape_interval},
        "rule_files": list(rule_files),
        "scrape_configs": [
            {"job_name": EXPORTER_JOB, "static_configs": [{"targets": list(exporter_targets)}]},
            {
                "job_name": ENGINES_JOB,
                "file_sd_configs": [{"files": list(engine_sd_files), "refresh_interval": sd_refresh}],
                "relabel_configs": [
                    # only targets a specsoak run wrote, and name each by run/config rather than host:port
                    {"source_labels": ["run"], "regex": ".+", "action": "keep"},
                    {"source_labels": ["run", "config"], "separator": "/", "target_label": "instance"},
                ],
            },
        ],
    }
