"""Prometheus and Grafana: the live exporter, engine targets, generated config, dashboards, backfill.

exporter.py    the run observer serving /metrics (its own registry; names in docs/observability.md)
targets.py     the file_sd targets file of the engines a run is serving (one per run folder)
rules.py       recording and alerting rules (each engine's own series: its adapter's promql_series)
scrape.py      prometheus.yml: the exporter's and the engines' scrape jobs
ruletests.py   promtool unit tests of the rules
dashboards.py  Grafana dashboards (grafana-foundation-sdk), provisioning, docker-compose.yml
schema.py      the strict check of generated dashboard JSON (dashboards/schema/)
openmetrics.py a finished run folder -> timestamped OpenMetrics text for promtool backfill
"""
