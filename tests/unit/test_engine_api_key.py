"""The API key (`server.api_key_env`) reaches every engine, never in the command as logged or stored.

Each engine gets the key the way its own source reads it (tests/fixtures/<engine>/README.md cites
it): llama-server, vLLM and TGI from their environment, SGLang from `--api-key` (it has no
environment variable), and TensorRT-LLM not at all (trtllm-serve takes no key), so a configuration
that asks it for one fails at start. The logged command is checked as rendered text.
"""

from __future__ import annotations

import json
import stat
from pathlib import Path

import pytest

from engines import ENGINES
from engines.base import Engine
from engines.errors import EngineStartError
from engines.types import LaunchSpec

KEY = "sk-test-Zq81vX2mEw"  # a value that appears nowhere else
ENV_VAR = {"llamacpp": "LLAMA_API_KEY", "vllm": "VLLM_API_KEY", "tgi": "API_KEY"}


def engine(name: str, tmp_path: Path, binary: Path | None = None, **spec: object) -> Engine:
    binary = binary or tmp_path / {"sglang": "python3"}.get(name, name)
    return ENGINES[name](LaunchSpec(model=tmp_path / "m", port=4321, binary=binary, **spec), tmp_path / "e.server.log")  # type: ignore[arg-type]  # **spec: the test's own keyword arguments


def rendered(cmd: list[str]) -> str:
    """The command as a person or a file sees it: joined, and as the manifest's JSON."""
    return " ".join(cmd) + "\n" + json.dumps(cmd)


@pytest.mark.parametrize("name", sorted(ENV_VAR))
def test_engines_with_an_environment_variable_get_the_key_there(name: str, tmp_path: Path) -> None:
    eng = engine(name, tmp_path, api_key=KEY)
    assert eng.engine_env() == {ENV_VAR[name]: KEY}
    assert KEY not in rendered(eng.command())
    assert KEY not in rendered(eng.display_command())
    assert eng.request_headers() == {"Authorization": f"Bearer {KEY}"}


def test_sglang_gets_the_key_as_a_flag_that_the_logged_command_masks(tmp_path: Path) -> None:
    eng = engine("sglang", tmp_path, api_key=KEY)
    cmd = eng.command()
    assert cmd[cmd.index("--api-key") + 1] == KEY  # SGLang reads it from --api-key only
    shown = rendered(eng.display_command())
    assert KEY not in shown and "--api-key ***" in shown
    assert eng.engine_env() == {}
    assert eng.request_headers() == {"Authorization": f"Bearer {KEY}"}


def test_sglang_keeps_a_key_flag_the_user_gave(tmp_path: Path) -> None:
    eng = engine("sglang", tmp_path, api_key=KEY, extra_args=("--api-key", KEY))
    assert eng.command().count("--api-key") == 1
    assert KEY not in rendered(eng.display_command())


def test_trtllm_refuses_a_key_it_would_never_check(tmp_path: Path) -> None:
    eng = engine("trtllm", tmp_path, api_key=KEY)
    with pytest.raises(EngineStartError, match="takes no API key"):
        eng.start()
    assert eng.proc is None and not eng.config_path.exists()
    assert KEY not in rendered(eng.command()) and eng.engine_env() == {}
    # behind an authenticating proxy the key is the proxy's: the engine starts without it
    proxied = engine("trtllm", tmp_path, api_key=KEY, request_base_url="http://127.0.0.1:9/")
    proxied.refuse_unsupported()
    assert proxied.request_headers() == {"Authorization": f"Bearer {KEY}"}


@pytest.mark.parametrize("name", sorted(ENGINES))
def test_without_a_key_nothing_is_added(name: str, tmp_path: Path) -> None:
    eng = engine(name, tmp_path)
    assert eng.engine_env() == {} and eng.request_headers() == {}
    assert "--api-key" not in eng.command()


@pytest.mark.parametrize("name", ["llamacpp", "vllm", "sglang", "tgi"])
def test_the_started_process_gets_the_key_and_its_log_never_shows_it(name: str, tmp_path: Path) -> None:
    """Through Engine.start(): a stand-in program (a shell script, no engine) reports which key
    variables it was given; the log's first line is the command as shown."""
    fake = tmp_path / "bin" / {"sglang": "python3"}.get(name, name)
    fake.parent.mkdir()
    fake.write_text(
        "#!/bin/sh\nenv | grep -E '^(LLAMA_API_KEY|VLLM_API_KEY|API_KEY)=' | cut -d= -f1 | sed 's/$/=set/'\nexit 0\n"
    )
    fake.chmod(fake.stat().st_mode | stat.S_IXUSR)
    eng = engine(name, tmp_path, binary=fake, api_key=KEY)
    eng.start()
    try:
        assert eng.proc is not None and eng.proc.wait(timeout=30) == 0
    finally:
        eng.stop(grace_s=1)
    log = eng.read_log()
    assert KEY not in log
    first = log.splitlines()[0]
    assert first.startswith("# ") and json.loads(first[2:])[0] == str(fake)
    if name in ENV_VAR:
        assert f"{ENV_VAR[name]}=set" in log
    else:
        assert "--api-key" in first and "***" in first
