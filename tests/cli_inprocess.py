"""`specsoak ARGS` through the CLI's own entry point (harness.cli.main: argument parsing, error lines, exit codes) in
this process: what a subprocess gives, without a fresh interpreter's imports (about a second each on this machine).
For tests that run it dozens of times; a test of the installed command itself keeps a subprocess."""

from __future__ import annotations

import io
import os
import subprocess
import sys
from contextlib import redirect_stderr, redirect_stdout
from unittest import mock


def cli_inprocess(
    *args: str, unset: tuple[str, ...] = (), env: dict[str, str] | None = None
) -> subprocess.CompletedProcess[str]:
    from harness import cli

    out, err = io.StringIO(), io.StringIO()
    environ = {k: v for k, v in os.environ.items() if k not in unset} | (env or {})
    code: int | str | None = 0
    with (
        mock.patch.dict(os.environ, environ, clear=True),
        mock.patch.object(sys, "argv", ["specsoak", *args]),
        redirect_stdout(out),
        redirect_stderr(err),
    ):
        try:
            cli.main()
        except SystemExit as exc:
            code = exc.code
    return subprocess.CompletedProcess(
        ["specsoak", *args], code if isinstance(code, int) else 1, out.getvalue(), err.getvalue()
    )
