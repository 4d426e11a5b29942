"""Engine faults in a real `specsoak run`: a clear reason, exit code 3, nothing recorded lost.

Also covered elsewhere and logged to the same ledger: a truncated GGUF (exit at start, corrupt model;
tests/integration/test_llamacpp_real.py), a crash and a hang during a soak (tests/integration/test_soak.py).
"""

from __future__ import annotations

import signal
import socket
from pathlib import Path
from typing import Any

import pytest

from harness.common.net import free_port
from harness.records.files import read_jsonl
from tests.faults.helpers import (
    cli,
    engine_child,
    finish,
    gone,
    lines_and_records,
    manifest,
    run_dir,
    scenario,
    start_cli,
    wait_for,
)
from tests.faults.ledger import FaultLog

pytestmark = pytest.mark.engine


def _failed_run(tmp_path: Path, p: Any, kind: str) -> tuple[Path, dict[str, Any]]:
    assert p.returncode == 3, p.stderr[-3000:]
    assert "Traceback" not in p.stderr and "configurations failed: baseline" in p.stderr
    run = run_dir(tmp_path / "results")
    assert run is not None
    (failure,) = list(read_jsonl(run / "failures.jsonl"))
    assert failure["kind"] == kind, failure
    m = manifest(run)
    assert m["status"] == "completed_with_failures" and m["configurations"]["baseline"]["status"] == "failed"
    return run, failure


def test_engine_binary_missing(tmp_path: Path, fault_log: FaultLog) -> None:
    row = fault_log.inject(
        "engine",
        "engine binary missing",
        "`server.binary: /nonexistent/llama-server`",
        "exit 3, EngineNotInstalled with the path",
    )
    p = cli(
        "run",
        str(scenario(tmp_path, server={"binary": "/nonexistent/llama-server"})),
        "--results",
        str(tmp_path / "results"),
        "--no-report",
    )
    _, failure = _failed_run(tmp_path, p, "EngineNotInstalled")
    assert "engine binary not found: /nonexistent/llama-server" in failure["message"]
    row.done(f"exit 3: {failure['message']}")


def test_engine_port_already_taken(tmp_path: Path, fault_log: FaultLog, llama_server_bin: Path) -> None:
    row = fault_log.inject(
        "engine",
        "port already taken",
        "a socket listens on `server.port` first",
        "exit 3, EngineStartError with llama-server's reason",
    )
    port = free_port()
    with socket.socket() as s:
        s.bind(("127.0.0.1", port))
        s.listen(1)
        p = cli(
            "run", str(scenario(tmp_path, server={"port": port})), "--results", str(tmp_path / "results"), "--no-report"
        )
    _, failure = _failed_run(tmp_path, p, "EngineStartError")
    assert "exited during start-up" in failure["message"] and (
        "bind" in failure["message"] or str(port) in failure["message"]
    ), failure
    row.done(f"exit 3: {failure['message'][:160]}")


def test_engine_out_of_memory_at_start(tmp_path: Path, fault_log: FaultLog, llama_server_bin: Path) -> None:
    """-c 4194304 asks llama-server for a 92 GiB KV cache: it fails to allocate and exits."""
    mem_kib = int(Path("/proc/meminfo").read_text().split()[1])
    assert mem_kib < 80 * 2**20, (
        "this machine could allocate the 92 GiB KV cache; the test needs a machine under 80 GiB"
    )
    row = fault_log.inject(
        "engine",
        "out of memory at start-up",
        "`server.ctx_size: 4194304` (a 92 GiB KV cache)",
        "exit 3, EngineStartError naming the allocation",
    )
    p = cli(
        "run",
        str(scenario(tmp_path, server={"ctx_size": 4194304, "parallel": 1})),
        "--results",
        str(tmp_path / "results"),
        "--no-report",
    )
    _, failure = _failed_run(tmp_path, p, "EngineStartError")
    assert "insufficient memory" in failure["message"] or "failed to allocate" in failure["message"], failure
    row.done(f"exit 3: {failure['message'][:160]}")


@pytest.mark.parametrize("how", ["exit", "hang"])
def test_engine_exits_or_hangs_mid_run(tmp_path: Path, fault_log: FaultLog, llama_server_bin: Path, how: str) -> None:
    row = fault_log.inject(
        "engine",
        f"engine {'exits (SIGKILL)' if how == 'exit' else 'hangs (SIGSTOP)'} mid-run",
        "signal to llama-server after the first record",
        "exit 3, the configuration failed with the reason, every record kept",
    )
    results = tmp_path / "results"
    n = 8  # long enough that a fast, quiet machine is still mid-run when the signal comes
    sc = scenario(tmp_path, server={"request_timeout_s": 8}, measurement={"requests_per_stream": n, "max_tokens": 64})
    proc = start_cli("run", str(sc), "--results", str(results), "--no-report")
    try:
        run = wait_for(lambda: run_dir(results), 60, "the run folder", proc)
        wait_for(lambda: lines_and_records(run / "requests.jsonl")[0] >= 1, 240, "a first record", proc)
        engine = wait_for(lambda: engine_child(proc.pid), 30, "the engine", proc)
        before = [r["id"] for r in lines_and_records(run / "requests.jsonl")[1]]
        engine.send_signal(signal.SIGKILL if how == "exit" else signal.SIGSTOP)
        out = finish(proc, 240)
    finally:
        if proc.poll() is None:
            proc.kill()
    assert proc.returncode == 3, out[-3000:]
    assert "Traceback" not in out
    (failure,) = list(read_jsonl(run / "failures.jsonl"))
    assert failure["stage"] == "measure"
    if how == "exit":
        assert failure["kind"] == "EngineCrashed" and "engine exited during measure" in failure["message"], failure
    else:
        assert failure["kind"] in ("ScrapeError", "EngineHung"), failure
    n_lines, records = lines_and_records(run / "requests.jsonl")
    assert n_lines == len(records) == n  # every request sent is one record
    assert set(before) <= {r["id"] for r in records}
    failed = [r for r in records if r["status"] == "error"]
    assert failed and all(r["error_kind"] in ("connection", "truncated", "timeout", "stall") for r in failed), failed
    assert gone(engine.pid)
    kinds = sorted({r["error_kind"] for r in failed})
    row.done(
        f"exit 3, {failure['kind']}: {failure['message'][:100]}; requests after it: {', '.join(kinds)}",
        samples_lost=len(set(before) - {r["id"] for r in records}),
    )
