"""Prometheus and Grafana: the live exporter, engine targets, generated config, dashboards, backfill.

exporter.py    the run observer serving /metrics (its own registry; names in docs/observability.md)
targets.py     the file_sd targets file of the engines a run is serving (one per run folder)
promconfig.py  prometheus.yml, recording and alerting rules, promtool rule tests
dashboards.py  Grafana dashboards (grafana-foundation-sdk), provisioning, docker-compose.yml
schema.py      the strict check of generated dashboard JSON (dashboards/schema/)
openmetrics.py a finished run folder -> timestamped OpenMetrics text for promtool backfill
"""
