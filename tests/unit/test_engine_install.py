"""The engine install's build output (harness/setup/install.py): progress from cmake's own "[ N%]" lines, the whole
output kept in a log, its tail shown when the build fails."""

from __future__ import annotations

import sys
from pathlib import Path

from harness.setup.install import SERVER_ONLY, build_with_progress


def _fake_build(tmp_path: Path, lines: list[str], rc: int) -> list[str]:
    script = "import sys\n" + "".join(f"print({line!r})\n" for line in lines) + f"sys.exit({rc})\n"
    said: list[str] = []
    got = build_with_progress([sys.executable, "-c", script], {}, tmp_path / "build.log", said.append)
    assert got == rc
    return said


def test_progress_a_line_per_five_percent_and_the_whole_output_in_the_log(tmp_path: Path) -> None:
    lines = ["-- configuring", *(f"[{p:3d}%] Building CXX object obj{p}.o" for p in range(0, 101, 2)), "done"]
    said = _fake_build(tmp_path, lines, 0)
    shown = [int(s.split("build")[1].split("%")[0]) for s in said if "% after" in s]
    assert shown == list(range(0, 101, 6))  # every 2%: the first step at least 5 after the last one shown
    assert "installed in" in said[-1]
    assert (tmp_path / "build.log").read_text().splitlines() == lines


def test_a_failed_build_shows_the_end_of_its_output(tmp_path: Path) -> None:
    said = _fake_build(tmp_path, ["[ 10%] Building a.o", "error: no such file"], 1)
    assert any("error: no such file" in s for s in said) and "pip exit 1" in said[-1]


def test_the_cmake_include_ships_with_the_package() -> None:
    text = SERVER_ONLY.read_text()
    assert SERVER_ONLY.parent.name == "setup" and "add_dependencies(specsoak_llama_server llama-server)" in text
