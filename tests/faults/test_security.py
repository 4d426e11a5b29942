"""Security: loopback by default, argument lists (a hostile model path), API keys from the environment never
written anywhere, run folders never group- or world-writable."""

from __future__ import annotations

import asyncio
import inspect
import json
import os
import shutil
import time
import urllib.error
import urllib.request
from pathlib import Path

import psutil
import pytest
import yaml

from engines.types import LaunchSpec
from harness import cli as cli_module
from harness.common.net import free_port
from harness.load.client import RequestParams, run_streams
from harness.metrics.exporter import MetricsExporter
from harness.prompts import Prompt
from tests.faults.helpers import cli, lines_and_records, manifest, run_dir, scenario
from tests.faults.ledger import FaultLog
from tests.faults.proxy import FaultProxy
from tests.integration.conftest import start

KEY = "sk-specsoak-" + os.urandom(12).hex()
SHORT = [Prompt("short", [{"role": "user", "content": "Count from one to twenty."}])]


def _listening(pid: int) -> set[str]:
    return {c.laddr.ip for c in psutil.Process(pid).net_connections(kind="tcp") if c.status == psutil.CONN_LISTEN}


def test_servers_the_harness_opens_bind_loopback_by_default(fault_log: FaultLog) -> None:
    row = fault_log.inject(
        "security",
        "servers bind loopback by default",
        "exporter and fault proxy started with defaults",
        "listen on 127.0.0.1 only",
    )
    assert inspect.signature(cli_module.run).parameters["metrics_host"].default == "127.0.0.1"
    assert LaunchSpec(model=Path("m")).host == "127.0.0.1"
    exporter = MetricsExporter().start()
    try:
        exporter_addrs = {
            c.laddr.ip
            for c in psutil.Process().net_connections(kind="tcp")
            if c.status == psutil.CONN_LISTEN and c.laddr.port == exporter.port
        }
        with FaultProxy("http://127.0.0.1:9") as proxy:
            proxy_addrs = {
                c.laddr.ip
                for c in psutil.Process().net_connections(kind="tcp")
                if c.status == psutil.CONN_LISTEN and c.laddr.port == proxy.port
            }
    finally:
        exporter.close()
    assert exporter_addrs == {"127.0.0.1"} and proxy_addrs == {"127.0.0.1"}
    row.done("exporter and proxy listen on 127.0.0.1 only")


@pytest.mark.engine
def test_api_key_is_enforced_sent_and_the_engine_listens_on_loopback(
    smollm2: Path, llama_server_bin: Path, tmp_path: Path, fault_log: FaultLog
) -> None:
    row = fault_log.inject(
        "security",
        "engine with an API key",
        "LaunchSpec.api_key (from `server.api_key_env`)",
        "a request without the key is refused; the harness's requests and scrapes carry it; engine on loopback",
    )
    engine = start(
        LaunchSpec(model=smollm2, ctx_size=1024, parallel=1, threads=2, port=free_port(), api_key=KEY),
        tmp_path / "server.log",
    )
    try:
        assert _listening(engine.pid) == {"127.0.0.1"}
        assert KEY not in " ".join(psutil.Process(engine.pid).cmdline())  # not on the command line (ps)
        req = urllib.request.Request(
            engine.base_url + "/v1/chat/completions", data=b"{}", headers={"Content-Type": "application/json"}
        )
        with pytest.raises(urllib.error.HTTPError) as refused:
            urllib.request.urlopen(req, timeout=30)
        assert refused.value.code == 401
        engine.scrape()  # /metrics needs the key too
        records = asyncio.run(
            run_streams(
                engine,
                SHORT,
                RequestParams(max_tokens=8, timeout_s=120),
                1,
                1,
                {"config": "k", "phase": "measure", "streams": 1, "repetition": 1},
                lambda r: None,
                (time.time(), time.perf_counter_ns()),
            )
        )
        assert records[0].status == "ok", records[0].error
        # llama.cpp takes the key from LLAMA_API_KEY: not on its command line, so nothing to mask in the shown one
        assert KEY not in engine.read_log() and "***" not in " ".join(engine.display_command())
    finally:
        engine.stop(5)
    row.done("401 without the key; requests and /metrics scrapes with it succeed; key not in ps, log or command")


@pytest.mark.engine
def test_hostile_model_path_api_key_and_umask_000_in_a_real_run(
    smollm2: Path, llama_server_bin: Path, tmp_path: Path, fault_log: FaultLog
) -> None:
    rows = [
        fault_log.inject(
            "security",
            "model path with spaces, quotes and `;`",
            'SmolLM2 copied to `it\'s "a" model; touch PWNED/…`',
            "the run works; the path is one argument, never seen by a shell",
        ),
        fault_log.inject(
            "security",
            "API key in the environment",
            "`server.api_key_env` names a variable holding a random key",
            "the key appears in no file of the run folder",
        ),
        fault_log.inject(
            "security",
            "umask 000",
            "`specsoak run` started with umask 000",
            "nothing in the run folder is group- or world-writable",
        ),
    ]
    hostile = tmp_path / 'it\'s "a" model; touch PWNED' / "model $(id) ;x.gguf"
    hostile.parent.mkdir()
    shutil.copyfile(smollm2, hostile)
    results = tmp_path / "results"
    sc = scenario(tmp_path, server={"model": str(hostile), "api_key_env": "SPECSOAK_TEST_API_KEY", "parallel": 1})
    data = yaml.safe_load(sc.read_text())
    data["soak"] = {
        "duration_s": 6,
        "shape": {"kind": "steady", "users": 1},
        "max_tokens": 8,
        "prompts": "short.jsonl",
        "watchdog": {"probe_interval_s": 0.5, "window_s": 3},
        "after_repetitions": 1,
    }  # Locust sends the key too
    sc.write_text(yaml.safe_dump(data, sort_keys=False))
    p = cli("run", str(sc), "--results", str(results), env={"SPECSOAK_TEST_API_KEY": KEY}, umask=0)
    assert p.returncode == 0, p.stderr[-3000:]
    run = run_dir(results)
    assert run is not None
    _, records = lines_and_records(run / "requests.jsonl")
    # the measured request, and the same phase again on the soaked engine
    assert [r["phase"] for r in records] == ["measure", "after_soak"] and all(r["status"] == "ok" for r in records), (
        records
    )
    soak = [r for f in (run / "soak").glob("*.jsonl") for r in lines_and_records(f)[1]]
    assert soak and all(r["status"] == "ok" for r in soak), [r.get("error") for r in soak]
    command = manifest(run)["configurations"]["baseline"]["command"]
    assert command[command.index("-m") + 1] == str(hostile)
    assert not list(tmp_path.rglob("PWNED")) and not (Path.cwd() / "PWNED").exists()
    rows[0].done("run completed; the manifest's command holds the path as one argument", runs_completed=1)

    leaks = [str(f) for f in run.rglob("*") if f.is_file() and KEY.encode() in f.read_bytes()]
    assert not leaks, leaks
    assert KEY not in p.stdout + p.stderr
    assert manifest(run)["scenario_parsed"]["server"]["api_key_env"] == "SPECSOAK_TEST_API_KEY"
    files = list(run.rglob("*"))
    rows[1].done(f"key found in 0 of {len(files)} files of the run folder, nor in the CLI's output")

    writable = [f"{f} {oct(f.stat().st_mode & 0o777)}" for f in [results, run, *files] if f.stat().st_mode & 0o022]
    assert not writable, writable
    assert run.stat().st_mode & 0o777 == 0o755
    rows[2].done(f"run folder 0o755; no group/world-writable entry among {len(files)}")
    json.dumps(command)
