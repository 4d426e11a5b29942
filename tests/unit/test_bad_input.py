"""The malformed-scenario corpus (tests/fixtures/bad_scenarios): exit 2, one line naming file and field, nothing started."""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

import pytest
import yaml

from tests.cli_inprocess import cli_inprocess
from tests.faults.ledger import FaultLog

CORPUS = Path(__file__).parents[1] / "fixtures" / "bad_scenarios"
INDEX: dict[str, str] = yaml.safe_load((CORPUS / "index.yaml").read_text())


def _cli(*args: str) -> subprocess.CompletedProcess[str]:
    env = {k: v for k, v in os.environ.items() if k != "SPECSOAK_TEST_UNSET_KEY_VAR"}
    env["COLUMNS"] = "400"
    return subprocess.run(
        [sys.executable, "-m", "harness.cli", *args], capture_output=True, text=True, timeout=120, env=env, check=False
    )


def test_corpus_is_complete_and_indexed() -> None:
    files = {p.name for p in CORPUS.glob("*.yaml")} - {"index.yaml"}
    assert files == set(INDEX), files ^ set(INDEX)
    assert len(files) >= 20


def test_every_bad_scenario_is_exit_2_one_line_naming_file_and_field_nothing_started(
    tmp_path: Path, fault_log: FaultLog
) -> None:
    results = tmp_path / "results"

    def check(name: str) -> list[str]:
        path = CORPUS / name
        problems = []
        for command in (["validate", str(path)], ["run", str(path), "--results", str(results)]):
            # the CLI's entry point in this process (50 scenario files x 2 commands); the installed command's own
            # process is test_missing_model_names_the_line's
            p = cli_inprocess(*command, unset=("SPECSOAK_TEST_UNSET_KEY_VAR",), env={"COLUMNS": "400"})
            lines = [ln for ln in p.stderr.splitlines() if ln.strip()]
            if p.returncode != 2:
                problems.append(f"{name} {command[0]}: exit {p.returncode}: {p.stderr[-500:]}")
            elif len(lines) != 1 or not lines[0].startswith(f"specsoak: error: {path}"):
                problems.append(f"{name} {command[0]}: not one line naming the file: {p.stderr!r}")
            elif INDEX[name] not in lines[0]:
                problems.append(f"{name} {command[0]}: expected {INDEX[name]!r} in {lines[0]!r}")
            elif "Traceback" in p.stderr or p.stdout.strip():
                problems.append(f"{name} {command[0]}: more than one line of output: {p.stdout!r}")
        return problems

    rows = {
        name: fault_log.inject(
            "input",
            f"bad scenario `{name}`",
            "tests/fixtures/bad_scenarios via `specsoak run` and `validate`",
            f"exit 2, one line: {INDEX[name]}",
        )
        for name in sorted(INDEX)
    }
    found = {name: check(name) for name in sorted(INDEX)}
    assert not results.exists(), "a run folder was created for bad input"
    problems = [p for ps in found.values() for p in ps]
    assert not problems, "\n".join(problems)
    for row in rows.values():
        row.done("exit 2, one line naming the file and the field; no run folder")


@pytest.mark.parametrize("name", ["missing_model_file.yaml"])
def test_missing_model_names_the_line(name: str) -> None:
    p = _cli("validate", str(CORPUS / name))
    assert p.returncode == 2 and f"{CORPUS / name}:3: server.model" in p.stderr, p.stderr
