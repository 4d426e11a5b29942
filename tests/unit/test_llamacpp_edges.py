"""llama.cpp start-up log and command edges that the parser tests left open (found by the mutation run,
docs/testing.md). Logs: the real captures in tests/fixtures/llamacpp/, edited line by line where a case
needs another build's line."""

from __future__ import annotations

from pathlib import Path

from engines.llamacpp import LlamaCpp
from engines.types import LaunchSpec
from tests.conftest import LLAMACPP

SLOTS_LINE = "load_model: initializing, n_slots = 4, n_ctx_slot = 2048, kv_unified = 'false'"


def log(name: str) -> str:
    return (LLAMACPP / f"{name}.server.log").read_text()


def without(text: str, fragment: str) -> str:
    return "\n".join(ln for ln in text.splitlines() if fragment not in ln)


def test_a_unified_kv_cache_is_one_context_shared_by_the_slots() -> None:
    text = log("base_lv4")
    assert SLOTS_LINE in text and "llama_context: n_ctx " in text
    split = LlamaCpp.parse_startup_log(without(text, "llama_context: n_ctx "))
    assert (split.kv_unified, split.ctx_total) == (False, 4 * 2048)  # no n_ctx line: slots × ctx per slot
    unified = LlamaCpp.parse_startup_log(
        without(text.replace("kv_unified = 'false'", "kv_unified = 'true'"), "llama_context: n_ctx ")
    )
    assert (unified.kv_unified, unified.ctx_total) == (True, 2048)


def test_builds_without_kv_unified_on_the_slots_line_read_the_context_line() -> None:
    text = log("base_lv4").replace(", kv_unified = 'false'", "")
    assert LlamaCpp.parse_startup_log(text).kv_unified is False
    on = text.replace("kv_unified            = false", "kv_unified            = true")
    assert LlamaCpp.parse_startup_log(on).kv_unified is True


def test_ctx_total_is_the_targets_context_not_the_drafts() -> None:
    text = log("spec_self_draft")
    lines = text.splitlines()
    n_ctx = [i for i, ln in enumerate(lines) if "llama_context: n_ctx " in ln]
    assert len(n_ctx) == 2  # the target's, then the draft's
    lines[n_ctx[1]] = lines[n_ctx[1]].replace("= 8192", "= 4096")
    assert LlamaCpp.parse_startup_log("\n".join(lines)).ctx_total == 8192
    lines[n_ctx[0]] = lines[n_ctx[0]].replace("= 8192", "= 16384")
    assert LlamaCpp.parse_startup_log("\n".join(lines)).ctx_total == 16384


def test_an_assert_is_the_reason_from_the_assert_on() -> None:
    reason = LlamaCpp.failure_reason(log("err_dflash_smollm2"))
    assert reason == 'GGML_ASSERT(target_layer_ids_n > 0 && "DFlash model has no target_layer_ids") failed'


def test_threads_and_synthetic_rates_reach_the_command(tmp_path: Path) -> None:
    spec = LaunchSpec(
        model=Path("/m.gguf"),
        algorithm="draft-simple",
        draft=Path("/d.gguf"),
        k=3,
        threads=6,
        synthetic_rates=(0.9, 0.5, 0.25),
        binary=tmp_path / "llama-server",
    )
    cmd = LlamaCpp(spec, tmp_path / "log").command()
    assert cmd[cmd.index("-t") + 1] == "6"
    assert cmd[cmd.index("--spec-synth-rates") + 1] == "0.9,0.5,0.25"
    assert cmd[cmd.index("--port") + 1] == str(spec.port) and cmd[:3] == [
        str(tmp_path / "llama-server"),
        "-m",
        "/m.gguf",
    ]
