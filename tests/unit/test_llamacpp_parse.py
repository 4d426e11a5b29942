"""Parsers over real llama-server captures (tests/fixtures/llamacpp, build 11434)."""

from __future__ import annotations

import json

import pytest

from engines.llamacpp import LlamaCpp, slots_speculative
from engines.types import EngineCounters, LaunchSpec, acceptance_figures, counters_delta
from tests.conftest import LLAMACPP, http_body


def log(name: str) -> str:
    return (LLAMACPP / f"{name}.server.log").read_text()


def test_base_lv4_capacity() -> None:
    cap = LlamaCpp.parse_startup_log(log("base_lv4"))
    assert (cap.slots, cap.ctx_per_slot, cap.ctx_total, cap.kv_unified) == (4, 2048, 8192, False)
    assert cap.target.model_mib == pytest.approx(92.10)
    assert cap.target.kv_mib == pytest.approx(180.0)
    assert cap.target.compute_mib == pytest.approx(16.64)
    assert cap.target.layers == 30
    assert cap.draft is None
    assert cap.spec_types == ()
    assert cap.memory_lines_seen
    assert cap.model_file_mib == pytest.approx(92.10)
    assert "AVX2" in cap.cpu_features and cap.threads == 2
    assert cap.fatal == ()


@pytest.mark.parametrize("name", ["base", "spec_self_draft_lv3"])
def test_default_verbosity_has_slots_but_no_memory(name: str) -> None:
    cap = LlamaCpp.parse_startup_log(log(name))
    assert (cap.slots, cap.ctx_per_slot, cap.ctx_total) == (4, 2048, 8192)
    assert not cap.memory_lines_seen
    assert cap.target.kv_mib is None and cap.target.model_mib is None


def test_self_draft_doubles_kv() -> None:
    cap = LlamaCpp.parse_startup_log(log("spec_self_draft"))
    assert cap.spec_types == ("draft-simple",) and cap.spec_n_max == 3
    assert cap.draft is not None
    assert cap.draft.kv_mib == pytest.approx(cap.target.kv_mib)
    assert cap.draft.model_mib == pytest.approx(92.10)


def test_truncated_draft_memory_is_its_own() -> None:
    cap = LlamaCpp.parse_startup_log(log("synth_trunc4_n3_L3"))
    assert cap.draft is not None
    assert cap.draft.layers == 4
    assert cap.draft.kv_mib == pytest.approx(24.0)
    assert cap.draft.model_mib == pytest.approx(37.14)
    assert cap.synthetic is not None and "mean length = 3.0" in cap.synthetic


def test_dflash_verify_compute_goes_to_target() -> None:
    cap = LlamaCpp.parse_startup_log(log("dflash_tiny_synthL4"))
    assert cap.spec_types == ("draft-dflash",) and cap.spec_n_max == 7
    # the verify graph is reserved after the slots exist: 194.94 MiB, the largest reservation
    assert cap.target.compute_mib == pytest.approx(194.94)
    assert cap.draft is not None and cap.draft.compute_mib == pytest.approx(98.75)
    # the memory-fitting pass prints an E line that is normal; it is not fatal
    assert not any("ctx_other" in f for f in cap.fatal)
    assert LlamaCpp.failure_reason(log("dflash_tiny_synthL4")) is None


def test_mtp_hybrid_recurrent_state() -> None:
    cap = LlamaCpp.parse_startup_log(log("tiny_qwen35_mtp_synthL3"))
    assert cap.spec_types == ("draft-mtp",)
    assert cap.target.recurrent_cells == 4
    assert cap.target.recurrent_mib == pytest.approx(0.09)
    assert cap.target.layers == 1  # one full-attention layer holds KV; the other is recurrent
    assert cap.draft is not None and cap.draft.model_mib is None  # MTP head lives in the target file
    assert cap.draft.kv_mib == pytest.approx(1.0)


@pytest.mark.parametrize(
    ("name", "expected"),
    [
        ("err_mtp_smollm2", "failed to create MTP context"),
        ("err_eagle3_smollm2", "draft model is not eagle3"),
        ("err_dflash_smollm2", "GGML_ASSERT(target_layer_ids_n > 0"),
        ("err_synth_L5_n3", "synthetic acceptance length must be finite and within [1, 4]"),
        ("err_synth_nospec", "synthetic acceptance requires an initialized speculative decoding context"),
        ("err_synth_rates_bad", "synthetic acceptance rates must contain 3 values, got 2"),
    ],
)
def test_failure_reasons(name: str, expected: str) -> None:
    reason = LlamaCpp.failure_reason(log(name))
    assert reason is not None and expected in reason
    assert "exiting due to" not in reason  # the specific line, not the generic one


def test_metrics_normalised_and_acceptance_definitions() -> None:
    text = (LLAMACPP / "eagle3_tiny_synthL3.GET_metrics_after.txt").read_text()
    c = LlamaCpp.normalise_metrics(http_body(text))
    assert (c.draft_tokens, c.accepted_tokens, c.verify_steps) == (1261, 861, 424)
    assert c.accepted_per_position == (354, 274, 233)
    fig = acceptance_figures(c)
    assert fig["acceptance"] == pytest.approx(861 / 1261)
    # synthetic length 3 was asked: mean length counts the bonus token
    assert fig["mean_accept_len"] == pytest.approx(3.0, abs=0.1)
    assert fig["per_position"][0] == pytest.approx(354 / 424)


def test_dflash_mean_length_matches_synthetic_4() -> None:
    c = LlamaCpp.normalise_metrics((LLAMACPP / "dflash_tiny_synthL4.GET_metrics_after.txt").read_text())
    assert acceptance_figures(c)["mean_accept_len"] == pytest.approx(4.0, abs=0.15)


def test_base_metrics_with_http_headers() -> None:
    c = LlamaCpp.normalise_metrics(http_body((LLAMACPP / "base.GET_metrics.txt").read_text()))
    assert c.output_tokens == 0 and c.draft_tokens == 0 and c.accepted_per_position == ()


def test_counters_delta() -> None:
    a = EngineCounters(draft_tokens=10, accepted_tokens=5, verify_steps=4, accepted_per_position=(3, 2))
    b = EngineCounters(draft_tokens=25, accepted_tokens=12, verify_steps=9, accepted_per_position=(6, 4, 2))
    d = counters_delta(a, b)
    assert (d.draft_tokens, d.accepted_tokens, d.verify_steps) == (15, 7, 5)
    assert d.accepted_per_position == (3, 2, 2)


def test_malformed_metrics_is_a_scrape_error() -> None:
    from harness.common.errors import ScrapeError

    with pytest.raises(ScrapeError):
        LlamaCpp.normalise_metrics("this is { not prometheus\n")


def test_slots_speculative() -> None:
    assert slots_speculative((LLAMACPP / "spec_self_draft.GET_slots.json").read_text())
    assert not slots_speculative((LLAMACPP / "err_eagle3_smollm2.GET_slots.json").read_text())
    assert not slots_speculative(http_body((LLAMACPP / "base.GET_slots.txt").read_text()))


def test_request_spec_stats_from_final_chunk() -> None:
    text = (LLAMACPP / "spec_self_draft.chat.stream_usage.sse.txt").read_text()
    chunks = [json.loads(line[5:]) for line in text.splitlines() if line.startswith("data:") and "[DONE]" not in line]
    final = next(c for c in chunks if c.get("usage"))
    stats = LlamaCpp.request_spec_stats(final)
    assert (stats.draft_tokens, stats.accepted_tokens) == (8, 8)


def test_command_is_an_argument_list_with_every_setting(tmp_path) -> None:
    weird = tmp_path / "my model; rm -rf 'x'.gguf"
    spec = LaunchSpec(
        model=weird,
        algorithm="draft-simple",
        draft=weird,
        k=3,
        k_min=1,
        synthetic_length=2.5,
        ctx_size=4096,
        parallel=2,
        threads=2,
        binary=tmp_path / "llama-server",
        port=1234,
        extra_args=("--foo",),
    )
    cmd = LlamaCpp(spec, tmp_path / "log").command()
    assert cmd[0] == str(tmp_path / "llama-server")
    assert cmd[cmd.index("-m") + 1] == str(weird)
    assert cmd[cmd.index("-md") + 1] == str(weird)
    for flag, value in (
        ("--spec-type", "draft-simple"),
        ("--spec-draft-n-max", "3"),
        ("--spec-draft-n-min", "1"),
        ("--spec-synth-len", "2.5"),
        ("-c", "4096"),
        ("-np", "2"),
        ("--host", "127.0.0.1"),
        ("-lv", "4"),
    ):
        assert cmd[cmd.index(flag) + 1] == value
    assert "--metrics" in cmd and "--slots" in cmd and cmd[-1] == "--foo"


def test_baseline_command_has_no_speculation(tmp_path) -> None:
    cmd = LlamaCpp(LaunchSpec(model=tmp_path / "m.gguf", binary=tmp_path / "x"), tmp_path / "log").command()
    assert "--spec-type" not in cmd and "-md" not in cmd
