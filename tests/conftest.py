from __future__ import annotations

from pathlib import Path

import pytest

FIXTURES = Path(__file__).parent / "fixtures"
LLAMACPP = FIXTURES / "llamacpp"


def http_body(text: str) -> str:
    """Strip the status line and headers of a raw HTTP capture."""
    if text.startswith("HTTP/"):
        for sep in ("\r\n\r\n", "\n\n"):
            if sep in text:
                return text.split(sep, 1)[1]
    return text


def pytest_addoption(parser: pytest.Parser) -> None:
    parser.addoption("--times-json", default=None, help="write the per-file seconds and engine starts to this file")


def pytest_configure(config: pytest.Config) -> None:
    from tests.timing import Timing

    config.pluginmanager.register(Timing(config), "specsoak-timing")


@pytest.fixture
def llamacpp_fixtures() -> Path:
    return LLAMACPP


# the fault ledger: `fault_log` for the fault tests, their figures at the end of the session
from tests.faults.ledger import fault_log, pytest_terminal_summary  # noqa: E402,F401  pytest's hooks and fixtures, after the path set-up above
