"""SGLang's server (python -m sglang.launch_server): command line, start-up log, /metrics, per-request stats.

Formats: read off the PyPI wheel sglang 0.5.23 (files and lines: tests/fixtures/sglang/README.md).

Acceptance from /metrics. SGLang exports acceptance as *gauges* (``sglang:spec_accept_length``,
``sglang:spec_accept_rate``) refreshed every 40 decode steps: a gauge is the last window's
value, not the phase's, and a phase shorter than 40 steps may leave it untouched. The harness
never uses them for its figures. It uses counters, whose deltas cover exactly one phase:

- ``verify_steps`` = ``sglang:spec_verify_calls_total``;
- ``accepted_tokens`` = ``generation_tokens - verify_steps - requests``: every verification step
  yields its accepted drafts plus one bonus token, and every request's first token comes from
  prefill (``sglang:num_requests_total``; without it the figure counts one extra token per
  request). Then ``1 + accepted / verify_steps`` is docs/metrics.md's mean length; SGLang's own
  ``completion_tokens / verify_ct`` also counts the prefill token;
- ``draft_tokens`` = ``verify_steps * K`` for the chain drafting the harness launches
  (``--speculative-eagle-topk 1``, K steps); unknown for NGRAM and for tree drafting (topk > 1).

Per request, ``return_spec_tokens_details: true`` returns ``sglext.spec_tokens_details``.

Where each log line and metric name comes from in SGLang's source (0.4.8 and 0.5.23):
tests/fixtures/sglang/README.md. SGLang takes its API key from ``--api-key`` only (no environment
variable); ``display_command()`` masks it, but SGLang's own ``server_args=`` start-up line prints it.
"""

from __future__ import annotations

import re
from typing import Any, ClassVar

from engines._common import (
    Samples,
    classify_context_overflow,
    dist_version,
    for_configuration,
    gib_mib,
    has_arg,
    python_exception,
    python_with,
)
from engines.base import SHARED_FIELDS, Engine
from engines.errors import SpeculationInactive
from engines.promql import (
    ENGINE_ACCEPTANCE,
    ENGINE_ACCEPTED_TOKENS,
    ENGINE_KV_USAGE,
    ENGINE_RUNNING,
    ENGINE_VERIFY_STEPS,
    ENGINE_WAITING,
    max_by,
    or_zero,
    r1,
    sum_by,
    while_positive,
)
from engines.types import (
    Capacity,
    EngineCounters,
    MemoryUse,
    RequestSpecStats,
    spec_count,
    startup_lines,
)

ALGORITHMS = {
    "draft-simple": "STANDALONE",
    "draft-mtp": "NEXTN",  # SGLang's alias of EAGLE without a draft path: the target's own MTP layers
    "draft-eagle3": "EAGLE3",
    "draft-dflash": "DFLASH",
    "draft-dspark": "DSPARK",
    "ngram": "NGRAM",
}
CHAIN = frozenset(ALGORITHMS) - {"ngram"}
SPEC_RESET_RUNNING = 48  # SGLang's max_running_requests under speculation unless given

_TP = re.compile(r"^\s*\[[^\]]*\bTP(\d+)\b[^\]]*\]")
_CAP = re.compile(r"max_total_num_tokens=(\d+)")
_RUNNING = re.compile(r"max_running_requests=(\d+)")
_CTX = re.compile(r"context_len=(\d+)")
# "KV Cache is allocated. [dtype: D, ]#tokens: N, K size: X GB, V size: Y GB" (MLA pools: "KV size: X GB")
_KV = re.compile(
    r"KV Cache is allocated\.\s*(?:dtype: [^,]+,\s*)?#tokens:\s*(\d+),\s*"
    r"(?:K size:\s*(\d+(?:\.\d+)?) GB,\s*V size:\s*(\d+(?:\.\d+)?) GB|KV size:\s*(\d+(?:\.\d+)?) GB)"
)
_WEIGHTS = re.compile(r"Load weight end\..*?mem usage=(\d+(?:\.\d+)?) GB")
# 0.4: "Capture cuda graph end." / "Capture draft cuda graph end."; 0.5: "Capture target verify CUDA graph end.",
# "Capture draft decode CUDA graph end.", "Capture draft extend CUDA graph end." (summed per model)
_GRAPH = re.compile(
    r"Capture (?:(draft|target) )?(?:(?:decode|verify|prefill|extend) )?(?:cuda|CUDA) graph end\..*?mem usage=(\d+(?:\.\d+)?) ?GB"
)
_MAMBA = re.compile(
    r"Mamba Cache is allocated\.\s*max_mamba_cache_size:\s*(\d+),\s*conv_state size:\s*(\d+(?:\.\d+)?) ?GB,\s*ssm_state size:\s*(\d+(?:\.\d+)?) ?GB"
)
# server_args: "ServerArgs(key=value, ...)" (0.4) or a dict "{'key': value, ...}" (0.5)
_ARG = r"['\"]?\s*[=:]\s*"
_ARGS_ALGO = re.compile(rf"speculative_algorithm{_ARG}(?:'(\w+)'|None)")
_ARGS_STEPS = re.compile(rf"speculative_num_steps{_ARG}(\d+)")
_ARGS_RUNNING = re.compile(rf"max_running_requests{_ARG}(None|\d+)")
_RESET = re.compile(r"max[ _]running[ _]requests.*?(?:reset|set|adjusted) to (\d+)", re.IGNORECASE)
_FATAL = re.compile(r"hit an exception|Received sigquit|scheduler is dead|Exception in", re.IGNORECASE)
_GENERIC = ("Initialization failed", "Rank 0 scheduler is dead")


_VERIFY_STEPS = r1("sglang:spec_verify_calls_total")


class SGLang(Engine):
    name: ClassVar[str] = "sglang"
    methods: ClassVar[frozenset[str]] = frozenset({"none", *ALGORITHMS})
    model_folders: ClassVar[bool] = True
    synthetic_acceptance: ClassVar[bool] = False
    install_hint: ClassVar[str] = "pip install sglang, then set server.binary to that python"
    typical_start_s: ClassVar[float | None] = 60.0
    honoured_fields: ClassVar[dict[str, str]] = {
        **SHARED_FIELDS,
        "server.binary": "the Python that has sglang (`-m sglang.launch_server`); default: this Python if it imports sglang",
        "server.model": "`--model-path` (a folder); also the request's `model`",
        "server.ctx_size": "`--context-length` = ctx_size / parallel",
        "server.parallel": "`--max-running-requests` (without it SGLang drops to 48 under speculation)",
        "server.api_key_env": "`--api-key` (masked in logs and the manifest)",
        "configurations[].algorithm": "`--speculative-algorithm`",
        "configurations[].draft": "`--speculative-draft-model-path`",
        "configurations[].k": "`--speculative-num-draft-tokens` K+1 (and `--speculative-num-steps` K, `--speculative-eagle-topk` 1 for drafters)",
    }
    promql_series: ClassVar[dict[str, str]] = {
        # every verification step yields its accepted drafts plus one token; every request's first comes from prefill
        ENGINE_ACCEPTED_TOKENS: while_positive(
            f"{r1('sglang:generation_tokens_total')} - {_VERIFY_STEPS} - {or_zero(r1('sglang:num_requests_total'), _VERIFY_STEPS)}",
            _VERIFY_STEPS,
        ),
        ENGINE_VERIFY_STEPS: _VERIFY_STEPS,
        # drafted tokens are not counted: SGLang's own gauge, its last logging window (40 decode steps)
        ENGINE_ACCEPTANCE: max_by("sglang:spec_accept_rate"),
        ENGINE_RUNNING: sum_by("sglang:num_running_reqs"),
        ENGINE_WAITING: sum_by("sglang:num_queue_reqs"),
        ENGINE_KV_USAGE: max_by("sglang:token_usage"),
    }
    # /health answers 503 until the server is up (after its warm-up request), then 200

    def command(self) -> list[str]:
        s = self.spec
        py = python_with("sglang", s.binary)
        if py is None:
            raise self.not_installed("a python with sglang")
        cmd = [py, "-m", "sglang.launch_server", "--model-path", str(s.model), "--host", s.host, "--port", str(s.port)]
        cmd += ["--enable-metrics"]
        if s.api_key and not has_arg(s.extra_args, "--api-key"):
            # SGLang reads its key from --api-key only (no environment variable): display_command() masks it
            cmd += ["--api-key", s.api_key]
        if not has_arg(s.extra_args, "--context-length"):
            cmd += ["--context-length", str(max(1, s.ctx_size // s.parallel))]
        if not has_arg(s.extra_args, "--max-running-requests"):
            # given explicitly, SGLang keeps it; left out, speculation resets it to 48
            cmd += ["--max-running-requests", str(s.parallel)]
        if not has_arg(s.extra_args, "--disable-radix-cache"):
            cmd += ["--disable-radix-cache"]  # a cached prefix would turn TTFT into a lookup
        if s.speculative:
            cmd += ["--speculative-algorithm", ALGORITHMS[s.algorithm]]
            if s.draft is not None:
                cmd += ["--speculative-draft-model-path", str(s.draft)]
            if s.k is not None:
                if s.algorithm in CHAIN:
                    cmd += ["--speculative-num-steps", str(s.k), "--speculative-eagle-topk", "1"]
                cmd += ["--speculative-num-draft-tokens", str(s.k + 1)]
        cmd += list(s.extra_args)
        return cmd

    @classmethod
    def parse_startup_log(cls, text: str) -> Capacity:
        ctx_total = slots = ctx_slot = n_max = None
        weights: list[float] = []
        kv: list[tuple[int, float]] = []
        graph: dict[str, float] = {}
        mamba: tuple[int, float] | None = None
        algo: str | None = None
        asked_running: str | None = None
        notes: list[str] = []
        seen = False
        for line in startup_lines(text):
            if (m := _TP.match(line)) and m.group(1) != "0":
                continue  # every tensor-parallel rank prints its own copy
            if "ServerArgs(" in line or "server_args=" in line:
                if m := _ARGS_ALGO.search(line):
                    algo = m.group(1)
                if m := _ARGS_STEPS.search(line):
                    n_max = int(m.group(1))
                if m := _ARGS_RUNNING.search(line):
                    asked_running = m.group(1)
                continue
            if m := _CAP.search(line):
                ctx_total = int(m.group(1))
                if r := _RUNNING.search(line):
                    slots = int(r.group(1))
                if c := _CTX.search(line):
                    ctx_slot = int(c.group(1))
            elif m := _KV.search(line):
                gb = float(m.group(4)) if m.group(4) else float(m.group(2)) + float(m.group(3))
                kv.append((int(m.group(1)), gib_mib(gb)))
                seen = True
            elif m := _WEIGHTS.search(line):
                weights.append(gib_mib(m.group(1)))
                seen = True
            elif m := _GRAPH.search(line):
                who = "draft" if m.group(1) == "draft" else "target"
                graph[who] = round(graph.get(who, 0.0) + gib_mib(m.group(2)), 3)
                seen = True
            elif m := _MAMBA.search(line):
                mamba = (int(m.group(1)), gib_mib(float(m.group(2)) + float(m.group(3))))
                seen = True
            elif m := _RESET.search(line):
                notes.append(line.strip())
        if algo and asked_running == "None" and slots == SPEC_RESET_RUNNING and not notes:
            notes.append(f"SGLang reset max_running_requests to {SPEC_RESET_RUNNING} under speculation")

        def mem(i: int, who: str) -> MemoryUse | None:
            if i >= max(len(weights), len(kv)) and who not in graph:
                return None
            return MemoryUse(
                model_mib=weights[i] if i < len(weights) else None,
                kv_mib=kv[i][1] if i < len(kv) else None,
                kv_cells=kv[i][0] if i < len(kv) else None,
                compute_mib=graph.get(who),
                recurrent_mib=mamba[1] if mamba and who == "target" else None,
                recurrent_cells=mamba[0] if mamba and who == "target" else None,
            )

        return Capacity(
            slots=slots,
            ctx_per_slot=ctx_slot,
            ctx_total=ctx_total,
            kv_unified=True if ctx_total is not None else None,
            target=mem(0, "target") or MemoryUse(),
            draft=mem(1, "draft") if algo else None,
            spec_types=(algo,) if algo else (),
            spec_n_max=n_max,
            fatal=tuple(cls._fatal_lines(text)),
            memory_lines_seen=seen,
            max_concurrency=round(ctx_total / ctx_slot, 2) if ctx_total and ctx_slot else None,
            notes=tuple(notes),
        )

    @classmethod
    def _fatal_lines(cls, text: str) -> list[str]:
        out = [ln.strip() for ln in text.splitlines() if _FATAL.search(ln)]
        exc = python_exception(text, _GENERIC)
        if exc:
            out.append(exc)
        return out

    @classmethod
    def failure_reason(cls, log_text: str) -> str | None:
        exc = python_exception(log_text, _GENERIC)
        if exc:
            return exc
        fatal = [ln.strip() for ln in log_text.splitlines() if _FATAL.search(ln)]
        return re.sub(r"^\[[^\]]*\]\s*", "", fatal[0]) if fatal else None

    def check_speculation(self) -> None:
        if not self.spec.speculative:
            return
        log = self.read_log()
        if not any(("ServerArgs(" in ln or "server_args=" in ln) for ln in log.splitlines()):
            return  # nothing to tell from: the counters will show it
        if not self.parse_startup_log(log).spec_types:
            raise SpeculationInactive(
                f"SGLang serves without speculation although '{self.spec.algorithm}' was asked: "
                + (self.failure_reason(log) or "speculative_algorithm=None in its server_args")
            )

    def request_extras(self) -> dict[str, Any]:
        extras: dict[str, Any] = {"model": str(self.spec.model)}
        if self.spec.speculative:
            extras["return_spec_tokens_details"] = True
        return extras

    @classmethod
    def request_spec_stats(cls, final_chunk: dict[str, Any]) -> RequestSpecStats:
        details = None
        choices = final_chunk.get("choices")
        for holder in (final_chunk, *(choices if isinstance(choices, list) else ())):
            ext = holder.get("sglext") if isinstance(holder, dict) else None
            if isinstance(ext, dict) and isinstance(ext.get("spec_tokens_details"), dict):
                details = ext["spec_tokens_details"]
                break
            if isinstance(holder, dict) and isinstance(holder.get("meta_info"), dict):
                details = holder["meta_info"]  # the native /generate answer
                break
        if not details:
            return RequestSpecStats()
        drafted, accepted = details.get("spec_num_proposed_drafts"), details.get("spec_num_correct_drafts")
        if accepted is None and details.get("spec_verify_ct") is not None:
            usage = final_chunk.get("usage")
            completion = spec_count(
                (usage.get("completion_tokens") if isinstance(usage, dict) else None)
                or details.get("completion_tokens")
            )
            verify = spec_count(details["spec_verify_ct"])
            if completion and verify is not None:
                accepted = completion - verify - 1
        return RequestSpecStats(draft_tokens=spec_count(drafted), accepted_tokens=spec_count(accepted))

    @classmethod
    def normalise_metrics(cls, text: str) -> EngineCounters:
        s = Samples(text, cls.name)
        gen = s.get("sglang:generation_tokens_total")
        verify = s.get("sglang:spec_verify_calls_total")
        requests = s.get("sglang:num_requests_total")
        accepted = None
        if verify is not None and gen is not None:
            accepted = 0.0 if verify == 0 else gen - verify - (requests or 0.0)
        return EngineCounters(
            prompt_tokens=s.get("sglang:prompt_tokens_total"),
            output_tokens=gen,
            accepted_tokens=accepted,
            verify_steps=verify,
            requests_processing=s.get("sglang:num_running_reqs"),
            requests_deferred=s.get("sglang:num_queue_reqs"),
            kv_usage=s.get("sglang:token_usage"),  # the fullest of the memory pools, 0 to 1
            preemptions=s.get("sglang:num_retracted_requests_total"),  # requests retracted for lack of KV
            requests_finished=requests,
        )

    def scrape(self) -> EngineCounters:
        s = self.spec
        chain = s.algorithm in CHAIN and s.k is not None and not has_arg(s.extra_args, "--speculative-eagle-topk")
        return for_configuration(super().scrape(), s.speculative, s.k if chain else None)

    @classmethod
    def classify_error(cls, status: int, body: str) -> str | None:
        if "request queue is full" in body.lower():
            return "overload"
        return classify_context_overflow(status, body, ("context length", "longer than the model"))

    @classmethod
    def installed_version(cls) -> str | None:
        return dist_version("sglang")

    @classmethod
    def validate_warnings(cls, configuration: Any, server: Any) -> list[str]:
        out = []
        if configuration.speculative:
            out.append(
                f"SGLang resets max_running_requests to {SPEC_RESET_RUNNING} under speculation unless it is given; "
                f"the harness passes --max-running-requests {server.parallel} (server.parallel), "
                "so a bare 'sglang.launch_server' of this configuration would serve fewer streams at once"
            )
            if server.parallel > SPEC_RESET_RUNNING:
                out.append(
                    f"server.parallel = {server.parallel} > {SPEC_RESET_RUNNING} with speculation: check the capacity "
                    "record's slots and KV tokens (draft KV and CUDA graphs grow with it)"
                )
            if configuration.k is None:
                out.append("no 'k': SGLang picks its own draft length; drafted tokens and acceptance are then unknown")
        if configuration.is_synthetic:
            out.append("SGLang has no synthetic acceptance: the configuration fails at start")
        if configuration.algorithm == "ngram":
            out.append("NGRAM drafts a tree: acceptance (accepted/drafted) is unknown, mean length is exact")
        return out
