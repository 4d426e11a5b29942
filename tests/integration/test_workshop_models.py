"""Every workshop model on the real llama-server, through the speculative type it exists for.

Each test proves the type was active (``/slots`` speculative, drafted tokens in the ``/metrics``
deltas); synthetic rows also prove the measured mean acceptance length is the one asked for.
A missing engine fails (conftest), never skips.
"""

from __future__ import annotations

import asyncio
import time
from dataclasses import dataclass
from pathlib import Path

import pytest

from engines.llamacpp import LlamaCpp
from engines.types import EngineCounters, LaunchSpec, acceptance_figures, counters_delta
from harness.common.errors import EngineStartError
from harness.common.net import free_port
from harness.load.client import RequestParams, run_streams
from harness.models import ensure
from harness.prompts import load_prompts
from tests.integration.conftest import start

pytestmark = pytest.mark.engine
REPO = Path(__file__).parents[2]


@dataclass(frozen=True)
class Measured:
    delta: EngineCounters
    client_draft_tokens: int
    acceptance: float | None
    mean_accept_len: float | None


def measure(engine: LlamaCpp, requests: int, max_tokens: int) -> Measured:
    """``requests`` greedy requests one after the other; the /metrics delta they caused."""
    prompts = load_prompts("builtin:repeat", REPO)
    before = engine.scrape()
    records = asyncio.run(
        run_streams(
            engine,
            prompts,
            RequestParams(max_tokens=max_tokens, timeout_s=300),
            1,
            requests,
            {"config": "t", "phase": "measure", "streams": 1, "repetition": 1},
            lambda r: None,
            (time.time(), time.perf_counter_ns()),
        )
    )
    delta = counters_delta(before, engine.scrape())
    assert all(r.status == "ok" for r in records), [r.error for r in records]
    assert delta.output_tokens == requests * max_tokens
    figures = acceptance_figures(delta)
    return Measured(delta, sum(r.draft_tokens or 0 for r in records), figures["acceptance"], figures["mean_accept_len"])


def launch(model: Path, tmp_path: Path, name: str, **spec: object) -> LlamaCpp:
    spec = {"ctx_size": 2048, **spec}
    return start(
        LaunchSpec(model=model, parallel=1, threads=2, port=free_port(), **spec),  # type: ignore[arg-type]  # **spec: LaunchSpec's keyword arguments
        tmp_path / f"{name}.server.log",
    )


def test_truncated_draft_speculates_with_real_low_acceptance(
    smollm2: Path, llama_server_bin: Path, tmp_path: Path
) -> None:
    engine = launch(smollm2, tmp_path, "trunc4", algorithm="draft-simple", draft=ensure("smollm2-trunc4"), k=3)
    try:
        engine.check_speculation()
        cap = engine.capacity()
        assert cap.spec_types == ("draft-simple",) and cap.synthetic is None
        assert cap.draft is not None and cap.draft.layers == 4  # the draft's KV cache has 4 layers
        m = measure(engine, requests=2, max_tokens=32)
    finally:
        engine.stop(5)
    assert m.delta.draft_tokens and m.delta.draft_tokens > 0
    assert m.client_draft_tokens == m.delta.draft_tokens
    # 4 of SmolLM2's 30 blocks agree with it rarely (1.1% was measured); greedy, so this is stable
    assert m.acceptance is not None and m.acceptance < 0.5


def _synthetic_run(name: str, model: Path, tmp_path: Path, requests: int, max_tokens: int, **spec: object) -> Measured:
    engine = launch(model, tmp_path, name, ctx_size=4096, **spec)
    try:
        engine.check_speculation()
        cap = engine.capacity()
        assert cap.spec_types == (spec["algorithm"],) and cap.spec_n_max == spec["k"]
        assert cap.synthetic is not None and "mean length" in cap.synthetic
        m = measure(engine, requests=requests, max_tokens=max_tokens)
    finally:
        engine.stop(5)
    assert m.delta.draft_tokens and m.delta.draft_tokens > 0
    assert m.client_draft_tokens == m.delta.draft_tokens
    assert m.mean_accept_len is not None
    return m


def test_mtp_target_speculates_at_the_synthetic_length(llama_server_bin: Path, tmp_path: Path) -> None:
    # Synthetic acceptance draws how many drafted tokens a step accepts; at L = 3, K = 3 one step's
    # length has a standard deviation of 1.2 tokens, so the mean is within 0.1 of L (two standard
    # errors) only after ~580 steps. One long request: every request replays the same seeded draws.
    m = _synthetic_run(
        "mtp", ensure("qwen35-tiny-mtp"), tmp_path, 1, 1800, algorithm="draft-mtp", k=3, synthetic_length=3.0
    )
    assert m.delta.verify_steps and m.delta.verify_steps > 500
    assert m.mean_accept_len is not None and abs(m.mean_accept_len - 3.0) <= 0.1, m


# Drafters too slow here for ~580 random steps (K = 7 needs ~2,600) run with 0/1 rates: every step
# accepts exactly the ones, so the mean acceptance length is known exactly after a few steps.
EXACT = [
    ("eagle3", "draft-eagle3", "smollm2-eagle3", (1.0, 1.0, 0.0)),
    ("dflash", "draft-dflash", "smollm2-dflash", (1.0, 1.0, 1.0, 0.0, 0.0, 0.0, 0.0)),
]


@pytest.mark.parametrize(("name", "algorithm", "draft", "rates"), EXACT, ids=[e[0] for e in EXACT])
def test_draft_speculates_at_the_synthetic_length(
    name: str,
    algorithm: str,
    draft: str,
    rates: tuple[float, ...],
    smollm2: Path,
    llama_server_bin: Path,
    tmp_path: Path,
) -> None:
    length = 1.0 + sum(rates)
    m = _synthetic_run(
        name, smollm2, tmp_path, 2, 64, algorithm=algorithm, draft=ensure(draft), k=len(rates), synthetic_rates=rates
    )
    assert m.mean_accept_len is not None and abs(m.mean_accept_len - length) <= 0.1, m


def test_mtp_target_without_speculation_is_its_own_baseline(llama_server_bin: Path, tmp_path: Path) -> None:
    engine = launch(ensure("qwen35-tiny-mtp"), tmp_path, "qwen35-none")
    try:
        engine.check_speculation()  # nothing asked, nothing to check
        cap = engine.capacity()
        assert cap.spec_types == () and cap.target.recurrent_mib  # the hybrid model's recurrent state
        m = measure(engine, requests=1, max_tokens=16)
    finally:
        engine.stop(5)
    assert not m.delta.draft_tokens


def test_dflash_with_a_plain_draft_aborts_at_start_with_the_assert(
    smollm2: Path, llama_server_bin: Path, tmp_path: Path
) -> None:
    spec = LaunchSpec(
        model=smollm2,
        algorithm="draft-dflash",
        draft=smollm2,
        k=7,
        ctx_size=2048,
        parallel=1,
        threads=2,
        port=free_port(),
    )
    with pytest.raises(EngineStartError, match=r"exited during start-up .*GGML_ASSERT\(target_layer_ids_n > 0"):
        start(spec, tmp_path / "dflash-smollm2.server.log")
