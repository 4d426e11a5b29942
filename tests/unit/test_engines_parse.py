"""vLLM, SGLang, TensorRT-LLM and TGI parsers over hand-written captures (tests/fixtures/<engine>/),
written in the formats each fixture folder's README traces to the engine's source. Counter figures follow docs/metrics.md:
mean acceptance length = 1 + accepted / verify_steps, bonus token included."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from engines.sglang import SGLang
from engines.tgi import Tgi
from engines.trtllm import TrtLlm
from engines.types import Capacity, EngineCounters, LaunchSpec, acceptance_figures, counters_delta
from engines.vllm import Vllm
from tests.conftest import FIXTURES


def text(engine: str, name: str) -> str:
    return (FIXTURES / engine / name).read_text()


# ---- vLLM ------------------------------------------------------------------------------------


def test_vllm_033_one_line_kv_and_memory() -> None:
    cap = Vllm.parse_startup_log(text("vllm", "v033_eagle3.server.log"))
    assert (cap.slots, cap.ctx_per_slot, cap.ctx_total, cap.kv_unified) == (32, 8192, 806_976, True)
    assert cap.max_concurrency == pytest.approx(98.51)
    assert cap.target.model_mib == pytest.approx(15.8712 * 1024, rel=1e-6)
    assert cap.target.kv_mib == pytest.approx(98.52 * 1024)
    assert cap.target.compute_mib == pytest.approx(0.61 * 1024)
    assert cap.spec_types == ("eagle3",) and cap.spec_n_max == 3
    assert cap.draft is None and any("drafter" in n for n in cap.notes)
    assert cap.memory_lines_seen and cap.fatal == ()
    assert Vllm.failure_reason(text("vllm", "v033_eagle3.server.log")) is None


def test_vllm_08_two_lines_and_gb() -> None:
    cap = Vllm.parse_startup_log(text("vllm", "v08_two_lines_mtp.server.log"))
    assert (cap.ctx_total, cap.ctx_per_slot, cap.slots) == (412_384, 16_384, 64)
    assert cap.max_concurrency == pytest.approx(25.17)
    assert cap.target.model_mib == pytest.approx(29.9888 * 1024, rel=1e-6)
    assert cap.spec_types == ("deepseek_mtp",) and cap.spec_n_max == 1


def test_vllm_06_v0_gpu_blocks_assume_block_16() -> None:
    cap = Vllm.parse_startup_log(text("vllm", "v06_v0_blocks.server.log"))
    assert (cap.kv_blocks, cap.kv_block_tokens, cap.ctx_total) == (2184, 16, 2184 * 16)
    assert (cap.ctx_per_slot, cap.slots) == (8192, 8)
    assert cap.max_concurrency == pytest.approx(4.27)
    assert cap.target.model_mib == pytest.approx(12.5523 * 1024, rel=1e-6)
    assert cap.spec_types == () and any("16" in n for n in cap.notes)


def test_vllm_cpu_ngram_has_no_drafter_note() -> None:
    cap = Vllm.parse_startup_log(text("vllm", "real_cpu_032_ngram.server.log"))
    assert (cap.slots, cap.ctx_per_slot, cap.ctx_total) == (4, 2048, 46_592)
    assert cap.spec_types == ("ngram",) and cap.spec_n_max == 3
    assert not any("drafter" in n for n in cap.notes)


@pytest.mark.parametrize(
    ("name", "method", "k", "ctx_total"),
    # the drafter's KV comes out of the same 1 GiB pool as the target's (46,592 tokens without one): a 30-block
    # self-draft halves it, a one-block head takes a 31st
    [
        ("draft_model_self", "draft_model", 3, 23_296),
        ("eagle3", "eagle3", 3, 45_056),
        ("mtp", "mtp", 1, 45_056),
        ("dflash", "dflash", 7, 45_056),
    ],
)
def test_vllm_real_drafter_start_up_logs(name: str, method: str, k: int, ctx_total: int) -> None:
    """Recorded from vllm-cpu 0.32 here (the workshop's drafters, README): the method and K from vLLM's own config
    line, the KV pool the drafter leaves, the drafter's weights inside the one weights figure, no fatal line."""
    log = text("vllm", f"real_cpu_032_{name}.server.log")
    cap = Vllm.parse_startup_log(log)
    assert cap.spec_types == (method,) and cap.spec_n_max == k
    assert (cap.slots, cap.ctx_per_slot, cap.ctx_total) == (4, 2048, ctx_total)
    assert any("drafter's weights" in n for n in cap.notes)
    assert cap.fatal == () and Vllm.failure_reason(log) is None


@pytest.mark.parametrize(
    ("name", "expected"),
    [
        ("real_cpu_032_suffix_refused.server.log", "ImportError: Arctic Inference is required for suffix decoding"),
        # the worker's traceback, logged line by line under "(Worker pid=N) ERROR ... [multiproc_executor.py:1063]"
        (
            "real_cpu_032_synthetic_refused.server.log",
            "AssertionError: Synthetic acceptance not supported with CPU sampling",
        ),
    ],
)
def test_vllm_real_refusals_give_vllms_own_line(name: str, expected: str) -> None:
    reason = Vllm.failure_reason(text("vllm", name))
    assert reason is not None and reason.startswith(expected), reason


def test_vllm_real_cpu_log_gives_pool_concurrency_and_memory() -> None:
    """Recorded from vllm-cpu 0.32 here: the CPU build prints its KV space and checkpoint size, not GPU lines."""
    cap = Vllm.parse_startup_log(text("vllm", "real_cpu_032_baseline.server.log"))
    assert (cap.slots, cap.ctx_per_slot, cap.ctx_total, cap.max_concurrency) == (4, 2048, 46_592, 22.75)
    assert (
        cap.target.kv_mib == 1024.0 and cap.target.model_mib == 256.0
    )  # "Explicitly set (1.0/…) GiB", "Checkpoint size: 0.25 GiB"
    assert (
        cap.spec_types == ()
        and cap.fatal == ()
        and Vllm.failure_reason(text("vllm", "real_cpu_032_baseline.server.log")) is None
    )


@pytest.mark.parametrize(
    ("name", "expected"),
    [
        ("err_kv_too_small.server.log", "ValueError: To serve at least one request"),
        ("err_cuda_oom.server.log", "torch.OutOfMemoryError: CUDA out of memory"),
    ],
)
def test_vllm_failure_is_the_root_cause_not_the_wrapper(name: str, expected: str) -> None:
    log = text("vllm", name)
    reason = Vllm.failure_reason(log)
    assert reason is not None and reason.startswith(expected), reason
    assert "Engine core initialization failed" not in reason
    assert Vllm.parse_startup_log(log).fatal


def test_vllm_counters_are_the_harness_definitions() -> None:
    """Recorded: vllm-cpu 0.32, SmolLM2 drafting for itself (draft_model, K 3), one greedy request: every drafted token
    accepted, 2 verification steps of 3 drafts. Its per-request stats (the stream's last chunk) say the same."""
    c = Vllm.normalise_metrics(text("vllm", "real_cpu_032_draft_model_self.metrics.txt"))
    assert (c.draft_tokens, c.accepted_tokens, c.verify_steps) == (6, 6, 2)
    assert c.accepted_per_position == (2, 2, 2)
    assert (c.output_tokens, c.prompt_tokens) == (8, 54)
    f = acceptance_figures(c)
    assert (
        f["mean_accept_len"] == pytest.approx(1 + 6 / 2) == 4.0
    )  # bonus token included: vLLM's mean_acceptance_length
    assert f["acceptance"] == pytest.approx(1.0)
    assert f["per_position"] == pytest.approx([1.0, 1.0, 1.0])


@pytest.mark.parametrize(("name", "positions"), [("eagle3", 3), ("mtp", 1), ("dflash", 7)])
def test_vllm_real_random_drafters_count_drafts_and_no_acceptance(name: str, positions: int) -> None:
    c = Vllm.normalise_metrics(text("vllm", f"real_cpu_032_{name}.metrics.txt"))
    assert c.draft_tokens == positions * c.verify_steps > 0 and c.accepted_tokens == 0
    assert c.accepted_per_position == (0,) * positions


def test_vllm_data_parallel_engines_are_summed() -> None:
    c = Vllm.normalise_metrics(text("vllm", "eagle3_dp2.metrics.txt"))
    assert (c.draft_tokens, c.accepted_tokens, c.verify_steps) == (24000, 17400, 8000)
    assert c.accepted_per_position == (7000, 6000, 4400)


def test_vllm_v0_emitted_tokens_give_verify_steps() -> None:
    c = Vllm.normalise_metrics(text("vllm", "v0_emitted.metrics.txt"))
    assert c.verify_steps == 5300 - 3300
    assert acceptance_figures(c)["mean_accept_len"] == pytest.approx(1 + 3300 / 2000)


def test_vllm_baseline_has_no_spec_counters_and_gauges_pass_through() -> None:
    c = Vllm.normalise_metrics(text("vllm", "baseline.metrics.txt"))
    assert c.draft_tokens is None and c.verify_steps is None
    assert (c.requests_processing, c.requests_deferred) == (1, 2)


def test_vllm_per_request_stats_from_final_usage_chunk() -> None:
    """The recorded stream's last chunk (--per-request-spec-decode-metrics summary), as the client reads it."""
    chunks = [
        json.loads(ln[5:])
        for ln in text("vllm", "real_cpu_032_draft_model_self.stream.sse").splitlines()
        if ln.startswith("data:") and "[DONE]" not in ln
    ]
    s = Vllm.request_spec_stats(chunks[-1])
    assert (s.draft_tokens, s.accepted_tokens) == (6, 6)
    assert all(Vllm.request_spec_stats(c).draft_tokens is None for c in chunks[:-1])
    assert Vllm.request_spec_stats({"usage": {"completion_tokens": 3}}).draft_tokens is None


def test_vllm_context_overflow_is_classified() -> None:
    body = text("vllm", "error_context.json")
    assert Vllm.classify_error(400, body) == "context_overflow"
    assert Vllm.classify_error(503, "Service Unavailable") is None


# ---- SGLang ----------------------------------------------------------------------------------


def test_sglang_eagle3_capacity_target_and_draft() -> None:
    cap = SGLang.parse_startup_log(text("sglang", "eagle3_tp1.server.log"))
    assert (cap.slots, cap.ctx_per_slot, cap.ctx_total) == (32, 8192, 413_827)
    assert cap.target.model_mib == pytest.approx(15.06 * 1024)
    assert cap.target.kv_mib == pytest.approx((25.26 + 25.26) * 1024)
    assert cap.target.compute_mib == pytest.approx(1.08 * 1024)
    assert cap.draft is not None
    assert cap.draft.model_mib == pytest.approx(0.81 * 1024)
    assert cap.draft.kv_mib == pytest.approx(1.58 * 1024)
    assert cap.draft.compute_mib == pytest.approx(0.35 * 1024)
    assert cap.spec_types == ("EAGLE3",) and cap.spec_n_max == 3
    assert cap.notes == ()


def test_sglang_tp_ranks_counted_once_and_reset_to_48_noted() -> None:
    cap = SGLang.parse_startup_log(text("sglang", "eagle_tp2_reset48.server.log"))
    assert cap.slots == 48
    assert cap.target.model_mib == pytest.approx(58.12 * 1024)  # TP0 only
    assert cap.draft is not None and cap.draft.model_mib == pytest.approx(2.70 * 1024)
    assert len(cap.notes) == 1 and "48" in cap.notes[0]


def test_sglang_hybrid_model_state_slots() -> None:
    cap = SGLang.parse_startup_log(text("sglang", "hybrid_mamba.server.log"))
    assert cap.target.recurrent_cells == 16
    assert cap.target.recurrent_mib == pytest.approx((0.19 + 9.00) * 1024)
    assert cap.spec_types == () and cap.draft is None


def test_sglang_failure_reason() -> None:
    log = text("sglang", "err_mem.server.log")
    assert (
        SGLang.failure_reason(log) == "RuntimeError: Not enough memory. Please try to increase --mem-fraction-static."
    )
    assert SGLang.parse_startup_log(log).fatal


def test_sglang_counters_not_gauges() -> None:
    c = SGLang.normalise_metrics(text("sglang", "eagle3.metrics.txt"))
    # accepted = generated - verify steps (one bonus each) - requests (first token from prefill)
    assert (c.verify_steps, c.accepted_tokens) == (4000, 12800 - 4000 - 100)
    assert acceptance_figures(c)["mean_accept_len"] == pytest.approx(1 + 8700 / 4000)
    # the gauge (3.41, a 40-step window) is not the phase's figure
    assert acceptance_figures(c)["mean_accept_len"] != pytest.approx(3.41)


def test_sglang_deltas_over_a_phase() -> None:
    # the scrape before the phase: 3000 tokens, 20 requests, 1000 verify steps already counted (accepted 1980)
    before_text = text("sglang", "baseline.metrics.txt").replace("6400.0", "3000.0").replace("50.0", "20.0")
    before = SGLang.normalise_metrics(
        before_text.replace(
            'spec_verify_calls_total{model_name="/models/Llama-3.1-8B-Instruct"} 0.0',
            'spec_verify_calls_total{model_name="/models/Llama-3.1-8B-Instruct"} 1000.0',
        )
    )
    assert (before.verify_steps, before.accepted_tokens) == (1000, 3000 - 1000 - 20)
    after = SGLang.normalise_metrics(text("sglang", "eagle3.metrics.txt"))
    d = counters_delta(before, after)
    assert (d.verify_steps, d.accepted_tokens, d.output_tokens) == (4000 - 1000, 8700 - 1980, 12800 - 3000)
    assert acceptance_figures(d)["mean_accept_len"] == pytest.approx(1 + 6720 / 3000)


def test_sglang_without_requests_counter_counts_one_extra_per_request() -> None:
    c = SGLang.normalise_metrics(text("sglang", "old_no_requests_counter.metrics.txt"))
    assert c.accepted_tokens == 12800 - 4000


def test_sglang_drafted_tokens_from_chain_length(tmp_path: Path) -> None:
    spec = LaunchSpec(model=Path("/m"), algorithm="draft-eagle3", draft=Path("/d"), k=3)
    eng = SGLang(spec, tmp_path / "x.log")
    eng.http_get = lambda path, timeout=5.0: (200, text("sglang", "eagle3.metrics.txt").encode())  # type: ignore[method-assign]  # a captured answer, no server
    c = eng.scrape()
    assert c.draft_tokens == 4000 * 3
    assert acceptance_figures(c)["acceptance"] == pytest.approx(8700 / 12000)
    base = SGLang(LaunchSpec(model=Path("/m")), tmp_path / "y.log")
    base.http_get = eng.http_get  # type: ignore[method-assign]  # the same captured answer
    assert base.scrape().accepted_tokens is None


def test_sglang_per_request_details() -> None:
    s = SGLang.request_spec_stats(json.loads(text("sglang", "stream_final_sglext.json")))
    assert (s.draft_tokens, s.accepted_tokens) == (114, 87)
    s = SGLang.request_spec_stats(json.loads(text("sglang", "stream_final_verify_only.json")))
    assert (s.draft_tokens, s.accepted_tokens) == (None, 128 - 40 - 1)


def test_sglang_errors() -> None:
    assert SGLang.classify_error(400, text("sglang", "error_context.json")) == "context_overflow"
    assert SGLang.classify_error(503, "The request queue is full.") == "overload"


# ---- TensorRT-LLM ----------------------------------------------------------------------------


def test_trtllm_capacity() -> None:
    cap = TrtLlm.parse_startup_log(text("trtllm", "eagle3.server.log"))
    assert (cap.kv_blocks, cap.kv_block_tokens, cap.ctx_total) == (30752, 32, 984_064)
    assert (cap.slots, cap.ctx_per_slot) == (32, 8192)
    assert cap.target.kv_mib == pytest.approx(60.06 * 1024)
    assert cap.target.model_mib == pytest.approx(16.02 * 1024)
    assert cap.spec_types == ("Eagle3",) and cap.spec_n_max == 3


def test_trtllm_blocks_times_tokens_per_block() -> None:
    cap = TrtLlm.parse_startup_log(text("trtllm", "blocks_only.server.log"))
    assert cap.ctx_total == 2048 * 64 and (cap.slots, cap.ctx_per_slot) == (8, 4096)


def test_trtllm_failure() -> None:
    assert TrtLlm.failure_reason(text("trtllm", "err_oom.server.log")).startswith("torch.OutOfMemoryError")


@pytest.mark.parametrize("name", ["eagle3.metrics.txt", "per_position.metrics.txt"])
def test_trtllm_verify_steps(name: str) -> None:
    c = TrtLlm.normalise_metrics(text("trtllm", name))
    assert (c.draft_tokens, c.accepted_tokens, c.verify_steps) == (12000, 8700, 4000)
    assert acceptance_figures(c)["mean_accept_len"] == pytest.approx(1 + 8700 / 4000)


def test_trtllm_metrics_path_and_config_file(tmp_path: Path) -> None:
    assert TrtLlm.metrics_path == "/prometheus/metrics"
    spec = LaunchSpec(
        model=Path("/m"), algorithm="draft-eagle3", draft=Path("/d"), k=3, port=8123, binary=Path("/x/trtllm-serve")
    )
    eng = TrtLlm(spec, tmp_path / "logs" / "eagle3.server.log")
    opts = eng.options()
    assert opts["return_perf_metrics"] is True
    assert opts["speculative_config"] == {"decoding_type": "Eagle3", "max_draft_len": 3, "speculative_model_dir": "/d"}
    cmd = eng.command()
    assert cmd[cmd.index("--config") + 1] == str(tmp_path / "logs" / "eagle3.trtllm.yaml")


# ---- TGI -------------------------------------------------------------------------------------


def test_tgi_capacity_ngram() -> None:
    cap = Tgi.parse_startup_log(text("tgi", "ngram.server.log"))
    assert (cap.kv_blocks, cap.kv_block_tokens, cap.ctx_total) == (3200, 16, 51200)
    assert (cap.slots, cap.ctx_per_slot) == (4, 2048)
    assert cap.spec_types == ("ngram",) and cap.spec_n_max == 2


def test_tgi_v3_defaults_and_medusa() -> None:
    cap = Tgi.parse_startup_log(text("tgi", "medusa_v3_defaults.server.log"))
    assert (cap.ctx_per_slot, cap.ctx_total, cap.slots) == (4096, 120000, None)
    assert cap.spec_types == ("medusa",) and cap.spec_n_max == 3


def test_tgi_failure_is_the_shard_error() -> None:
    log = text("tgi", "err_shard.server.log")
    assert Tgi.failure_reason(log).startswith("torch.OutOfMemoryError")
    assert any("ShardCannotStart" in f for f in Tgi.parse_startup_log(log).fatal)


def test_tgi_skipped_tokens_histogram(tmp_path: Path) -> None:
    c = Tgi.normalise_metrics(text("tgi", "ngram.metrics.txt"))
    # steps: the skipped-tokens histogram counts one observation per step, each request's first (prefill) included
    assert (c.accepted_tokens, c.verify_steps, c.output_tokens) == (770, 510 - 10, 1280)
    eng = Tgi(LaunchSpec(model=Path("/m"), algorithm="ngram", k=2), tmp_path / "t.log")
    eng.http_get = lambda path, timeout=5.0: (200, text("tgi", "ngram.metrics.txt").encode())  # type: ignore[method-assign]  # a captured answer, no server
    f = acceptance_figures(eng.scrape())
    assert f["mean_accept_len"] == pytest.approx(1 + 770 / 500)
    assert f["acceptance"] == pytest.approx(770 / 1000)


def test_tgi_validation_error_is_context_overflow() -> None:
    body = json.loads(text("tgi", "error_validation.json"))["error"]
    assert Tgi.classify_error(422, body) == "context_overflow"
    assert Tgi.classify_error(500, body) == "context_overflow"  # streamed: the client passes 500
    assert Tgi.classify_error(429, "Model is overloaded") == "overload"
    assert Tgi.classify_error(422, "Input validation error: `temperature` must be strictly positive") is None


# ---- every engine ----------------------------------------------------------------------------


@pytest.mark.parametrize("cls", [Vllm, SGLang, TrtLlm, Tgi])
def test_capacity_round_trips_through_json(cls: type) -> None:
    for log in sorted((FIXTURES / cls.name).glob("*.server.log")):
        cap = cls.parse_startup_log(log.read_text())
        assert Capacity.from_dict(json.loads(json.dumps(cap.to_dict()))) == cap, log.name


@pytest.mark.parametrize("cls", [Vllm, SGLang, TrtLlm, Tgi])
def test_empty_inputs_do_not_crash(cls: type) -> None:
    assert cls.parse_startup_log("") == Capacity()
    assert cls.failure_reason("") is None
    assert cls.normalise_metrics("") == EngineCounters()
