"""The memory table's check: restart a configuration at its servable context and fill it.

The servable context is computed from the start-up log and the scenario's memory budget
(harness/detect/servable.py). Computed is not proven, so after a configuration's measurement the
runner starts the engine again with that context (rounded down to whole 256-token blocks per
slot), fills every slot at once with a prompt that leaves only a few tokens free, samples the engine's
resident memory while it does, and sends one prompt past the context, which must be
refused as a context overflow. One record per configuration goes to fill_checks.jsonl;
docs/reports.md#memory says how to read it.
"""

from __future__ import annotations

import json
import math
import threading
import time
import urllib.error
import urllib.request
from concurrent.futures import ThreadPoolExecutor
from dataclasses import replace
from pathlib import Path
from typing import Any

from engines.base import Engine
from engines.types import LaunchSpec
from harness.common.errors import EngineError
from harness.common.net import free_port
from harness.detect.servable import servable_context
from harness.load.client import classify_http
from harness.probe.memory import tree_rss_bytes

BLOCK = 256  # llama.cpp pads a slot's context to 256 cells; the check starts at whole blocks, at least one per slot
GEN_TOKENS = 8  # tokens generated after each fill prompt (ignore_eos): the slot ends this close to full
HEADROOM = 4  # tokens left free below the slot's context
OVERFLOW_TOKENS = 64  # the refused prompt is this far past the context
CALIBRATION_WORDS = (40, 240)


class RssSampler:
    """Peak resident memory of a process and its children, sampled in a thread."""

    def __init__(self, pid: int, interval_s: float = 0.1):
        self.pid, self.interval = pid, interval_s
        self.peak = 0
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._loop, daemon=True)

    def sample(self) -> int:
        total = tree_rss_bytes(self.pid)
        self.peak = max(self.peak, total)
        return total

    def _loop(self) -> None:
        while not self._stop.wait(self.interval):
            self.sample()

    def __enter__(self) -> RssSampler:
        self.sample()
        self._thread.start()
        return self

    def __exit__(self, *exc: object) -> None:
        self._stop.set()
        self._thread.join()
        self.sample()


def _chat(engine: Engine, text: str, max_tokens: int, timeout_s: float) -> dict[str, Any]:
    """One non-streamed chat request: {'ok', 'prompt_tokens', 'completion_tokens'} or {'ok': False, 'kind', 'error'}."""
    body = {
        "messages": [{"role": "user", "content": text}],
        "max_tokens": max_tokens,
        "temperature": 0.0,
        "ignore_eos": True,
        "stream": False,
        **engine.request_extras(),
    }
    req = urllib.request.Request(
        engine.request_url + engine.chat_path,
        data=json.dumps(body).encode(),
        headers={"Content-Type": "application/json", **engine.request_headers()},
    )
    try:
        with urllib.request.urlopen(req, timeout=timeout_s) as resp:
            usage = json.loads(resp.read()).get("usage") or {}
            return {
                "ok": True,
                "prompt_tokens": usage.get("prompt_tokens"),
                "completion_tokens": usage.get("completion_tokens"),
            }
    except urllib.error.HTTPError as exc:
        text_ = exc.read().decode("utf-8", "replace")[:300]
        kind = engine.classify_error(exc.code, text_) or classify_http(exc.code, text_)
        return {"ok": False, "kind": kind, "error": f"HTTP {exc.code}: {text_.strip()}"}
    except (OSError, ValueError) as exc:
        return {"ok": False, "kind": "connection", "error": f"{type(exc).__name__}: {exc}"}


def _text(words: int, tag: str) -> str:
    return f"{tag}:" + " the" * words


def _calibrate(engine: Engine, timeout_s: float) -> tuple[float, float]:
    """Prompt tokens = a + b × words, from two requests (the chat template's tokens are in a)."""
    pts = []
    for w in CALIBRATION_WORDS:
        r = _chat(engine, _text(w, "slot 0"), 1, timeout_s)
        if not r["ok"] or not r.get("prompt_tokens"):
            raise EngineError(
                f"calibration request of {w} words failed: {r.get('error') or 'no usage.prompt_tokens in the answer'}"
            )
        pts.append((w, float(r["prompt_tokens"])))
    (w1, t1), (w2, t2) = pts
    b = (t2 - t1) / (w2 - w1)
    if b <= 0:
        raise EngineError(f"calibration: {w1} words gave {t1:.0f} tokens and {w2} gave {t2:.0f}")
    return t1 - b * w1, b


def fill_check(
    engine_cls: type[Engine],
    spec: LaunchSpec,
    cap: dict[str, Any],
    budget_mib: float,
    log_path: Path,
    start_timeout_s: float,
    request_timeout_s: float,
    stop_grace_s: float,
    say: Any = print,
) -> dict[str, Any]:
    """Restart at the servable context under ``budget_mib``, fill every slot, try one prompt past it."""
    rec: dict[str, Any] = {"config": cap.get("config"), "budget_mib": budget_mib, "status": None, "t_unix": time.time()}
    sv = servable_context(cap, budget_mib)
    if sv is None or sv.ctx_total is None:
        return {
            **rec,
            "status": "not_computed",
            "detail": "the start-up log gave no KV buffer: no servable context to check",
        }
    rec.update(
        computed_ctx_total=sv.ctx_total,
        computed_ctx_per_slot=sv.ctx_per_slot,
        fixed_mib=sv.fixed_mib,
        kv_kib_per_token=sv.kv_kib_per_token,
    )
    if not engine_cls.ctx_sizes_kv:
        return {
            **rec,
            "status": "unsupported",
            "detail": f"{engine_cls.name} sizes its KV pool from a memory share, not from the context: not restarted",
        }
    slots = int(cap.get("slots") or spec.parallel)
    # llama.cpp pads each slot's context up to whole blocks (2304 for 2 slots runs as 2560): round down per slot
    unit = BLOCK * (1 if cap.get("kv_unified") else slots)
    ctx = math.floor(sv.ctx_total / unit) * unit
    if ctx < unit:
        return {
            **rec,
            "status": "too_small",
            "started_ctx_total": None,
            "detail": f"the budget leaves {sv.ctx_total} tokens of context: less than {BLOCK} per slot for {slots} slots",
        }
    rec["started_ctx_total"] = ctx
    engine = engine_cls(
        replace(spec, ctx_size=ctx, port=free_port(), request_base_url=None), log_path
    )  # straight to the engine
    try:
        engine.start()
        rec["ready_s"] = round(engine.wait_ready(start_timeout_s), 3)
        newcap = engine.capacity()
        per_slot = newcap.ctx_per_slot or (ctx if cap.get("kv_unified") else ctx // slots)
        totals = [m.total_mib for m in (newcap.target, newcap.draft) if m is not None and m.total_mib is not None]
        rec.update(
            engine_ctx_total=newcap.ctx_total,
            engine_ctx_per_slot=per_slot,
            engine_slots=newcap.slots,
            log_total_mib=round(sum(totals), 2) if totals else None,
        )
        assert engine.pid is not None
        a, b = _calibrate(engine, request_timeout_s)
        rec["tokens_per_word"] = round(b, 4)
        n_fill = newcap.slots or slots
        words = max(1, math.floor((per_slot - GEN_TOKENS - HEADROOM - a) / b))
        say(
            f"  fill check: {ctx} tokens of context ({per_slot} per slot), filling {n_fill} slots with ~{a + b * words:.0f}-token prompts"
        )
        with RssSampler(engine.pid) as rss:
            rss_ready = rss.sample()
            t0 = time.perf_counter()
            with ThreadPoolExecutor(max_workers=n_fill) as pool:
                fills = list(
                    pool.map(
                        lambda i: _chat(engine, _text(words, f"slot {i}"), GEN_TOKENS, request_timeout_s), range(n_fill)
                    )
                )
            rec["fill_s"] = round(time.perf_counter() - t0, 2)
        rec["rss_ready_mib"] = round(rss_ready / 2**20, 1)
        rec["rss_peak_mib"] = round(rss.peak / 2**20, 1)
        done = [f for f in fills if f["ok"]]
        filled = [int(f["prompt_tokens"] or 0) + int(f["completion_tokens"] or 0) for f in done]
        rec["fills_ok"] = len(done)
        rec["fills"] = len(fills)
        rec["min_tokens_filled"] = min(filled) if filled else None
        rec["fill_errors"] = sorted({f"{f['kind']}: {f['error']}" for f in fills if not f["ok"]})[:5]
        over = _chat(
            engine, _text(math.ceil((per_slot + OVERFLOW_TOKENS - a) / b), "overflow"), GEN_TOKENS, request_timeout_s
        )
        rec["overflow_refused"] = not over["ok"] and over.get("kind") == "context_overflow"
        rec["overflow_answer"] = over.get("error") or f"served: {over.get('prompt_tokens')} prompt tokens"
        if not engine.alive():
            raise EngineError(
                f"engine exited during the fill: {engine.failure_reason(engine.read_log()) or 'no reason in its log'}"
            )
        full = bool(filled) and len(done) == len(fills) and min(filled) >= per_slot - GEN_TOKENS - HEADROOM - 8
        as_asked = newcap.ctx_total in (None, ctx)  # an engine that padded the context up may be over the budget
        rec["status"] = "ok" if full and rec["overflow_refused"] and as_asked else "failed"
        rec["detail"] = _detail(rec, per_slot, budget_mib)
    except EngineError as exc:
        rec.update(status="engine_failed", detail=f"{type(exc).__name__}: {exc}")
    finally:
        rec["engine_exit"] = engine.stop(stop_grace_s)
        rec["log"] = str(log_path)
    return rec


def _detail(rec: dict[str, Any], per_slot: int, budget: float) -> str:
    parts = [
        f"{rec['fills_ok']}/{rec['fills']} slots filled to ≥ {rec['min_tokens_filled']} of {per_slot} tokens at once"
        if rec["min_tokens_filled"] is not None
        else f"0/{rec['fills']} slots filled ({'; '.join(rec['fill_errors'])})"
    ]
    if rec.get("log_total_mib") is not None:
        parts.append(
            f"log total {rec['log_total_mib']:.0f} MiB {'≤' if rec['log_total_mib'] <= budget else '>'} budget {budget:g}"
        )
    if rec.get("engine_ctx_total") not in (None, rec.get("started_ctx_total")):
        parts.append(
            f"the engine ran {rec['engine_ctx_total']} tokens of context, not the {rec['started_ctx_total']} asked"
        )
    parts.append(f"peak RSS {rec['rss_peak_mib']:.0f} MiB (at ready {rec['rss_ready_mib']:.0f})")
    parts.append(
        "a prompt past the context refused"
        if rec["overflow_refused"]
        else f"a prompt past the context was NOT refused: {rec['overflow_answer']}"
    )
    return "; ".join(parts)
