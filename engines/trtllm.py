"""TensorRT-LLM's ``trtllm-serve`` (PyTorch backend): command line, start-up log, Prometheus metrics.

Formats: read off TensorRT-LLM main's source (``trtllm-serve``, PyTorch backend); no real capture
(tests/fixtures/trtllm/README.md). The speculative settings go into a
YAML file passed with ``--config`` (written next to the server log when the engine starts), with
``return_perf_metrics: true``: without it ``/prometheus/metrics`` has no speculative counters.
Plain ``/metrics`` is JSON iteration stats, cleared on read, so the harness never reads it.

Counters: ``trtllm_spec_decode_num_draft_tokens_total`` and ``..._num_accepted_tokens_total``
(accepted drafts, no bonus token). There is no verification-step counter, so
``verify_steps = generation_tokens - accepted - requests`` (each step yields its accepted drafts
plus one bonus token; each request's first token comes from the context phase). Builds that
export the per-position counters ``trtllm_spec_decode_drafted_tokens_total{token_position}``
give it exactly: every step drafts position 0. The gauge ``trtllm_spec_decode_acceptance_length``
is the last iteration's value and is not used.

Where each log line and metric name comes from in TensorRT-LLM's source: tests/fixtures/trtllm/README.md.
The speculative decoding type and draft length are read from the ``LLM Args:`` dump rank 0 logs at
start (``decoding_type='Eagle3'``, ``max_draft_len=3`` inside ``speculative_config=...``). ``trtllm-serve`` takes
no API key (neither flag nor environment): a configuration with one fails at start unless
``server.request_base_url`` names a proxy in front of it (the key is then the proxy's).
"""

from __future__ import annotations

import re
from pathlib import Path
from typing import Any, ClassVar

import yaml

from engines._common import (
    Samples,
    classify_context_overflow,
    dist_version,
    for_configuration,
    gib_mib,
    has_arg,
    python_exception,
    which,
)
from engines.base import SHARED_FIELDS, Engine
from engines.errors import EngineStartError, ScrapeError, SpeculationInactive
from engines.promql import (
    ENGINE_ACCEPTANCE,
    ENGINE_ACCEPTED_TOKENS,
    ENGINE_DRAFT_TOKENS,
    ENGINE_KV_USAGE,
    ENGINE_RUNNING,
    ENGINE_VERIFY_STEPS,
    ENGINE_WAITING,
    max_by,
    r1,
    sum_by,
    while_positive,
)
from engines.types import Capacity, EngineCounters, MemoryUse, startup_lines

DECODING_TYPES = {
    "draft-simple": "Draft_Target",
    "draft-mtp": "MTP",
    "draft-eagle3": "Eagle3",
    "draft-dflash": "DFlash",
    "draft-dspark": "DSpark",
    "ngram": "NGram",
    "suffix": "SA",
}

_BLOCKS = re.compile(r"Number of blocks in KV cache primary pool:\s*(\d+)")
_BLOCK_TOKENS = re.compile(r"Number of tokens per block:\s*(\d+)")
_KV_ALLOC = re.compile(r"\[MemUsageChange\] Allocated\s*(\d+(?:\.\d+)?) GiB for max tokens in paged KV cache \((\d+)\)")
# "max_batch_size=" was added to this line in later builds; slots are max_num_requests either way
_LIMITS = re.compile(r"max_seq_len=(\d+),\s*max_num_requests=(\d+),\s*max_num_tokens=(\d+)")
_WEIGHTS = re.compile(r"Memory used after loading model weights \(inside torch\)[^:]*:\s*(\d+(?:\.\d+)?) GiB")
# fields of the speculative config (tensorrt_llm/llmapi/llm_args.py) as the "LLM Args:" dump prints them
_SPEC = re.compile(r"decoding_type['\"]?\s*[=:]\s*['\"]?(\w+)")
_DRAFT_LEN = re.compile(r"max_draft_len['\"]?\s*[=:]\s*(\d+)")
_ERROR = re.compile(r"\[TRT-LLM\]\s*\[E\]|\[TensorRT-LLM\]\[ERROR\]")


_DRAFT = f"({r1('trtllm_spec_decode_num_draft_tokens_total')} or {r1('trtllm_spec_decode_drafted_tokens_total')})"
_ACCEPTED = (
    f"({r1('trtllm_spec_decode_num_accepted_tokens_total')} or {r1('trtllm_spec_decode_accepted_tokens_total')})"
)
_REQUESTS = f"({r1('trtllm_request_success_total')} or {r1('trtllm_num_requests_completed_total')})"
_GENERATED = r1("trtllm_generation_tokens_total")
_POSITION0 = r1("trtllm_spec_decode_drafted_tokens_total", 'token_position="0"')


class TrtLlm(Engine):
    name: ClassVar[str] = "trtllm"
    methods: ClassVar[frozenset[str]] = frozenset({"none", *DECODING_TYPES})
    model_folders: ClassVar[bool] = True
    metrics_path: ClassVar[str] = "/prometheus/metrics"
    synthetic_acceptance: ClassVar[bool] = False
    install_hint: ClassVar[str] = "pip install tensorrt_llm"
    typical_start_s: ClassVar[float | None] = 120.0
    honoured_fields: ClassVar[dict[str, str]] = {
        **SHARED_FIELDS,
        "server.binary": "`trtllm-serve`; default: on PATH",
        "server.model": "the positional model (a folder); also the request's `model`",
        "server.ctx_size": "`--max_seq_len` = ctx_size / parallel",
        "server.parallel": "`--max_batch_size`",
        "configurations[].algorithm": "`speculative_config.decoding_type` in the `--config` YAML",
        "configurations[].draft": "`speculative_config.speculative_model_dir`",
        "configurations[].k": "`max_draft_len` (draft-mtp: `num_nextn_predict_layers`)",
    }
    promql_series: ClassVar[dict[str, str]] = {
        ENGINE_DRAFT_TOKENS: _DRAFT,
        ENGINE_ACCEPTED_TOKENS: _ACCEPTED,
        # every step drafts position 0; without per-position counters: generated - accepted - requests
        ENGINE_VERIFY_STEPS: f"({_POSITION0} or {while_positive(f'{_GENERATED} - {_ACCEPTED} - {_REQUESTS}', _DRAFT)})",
        ENGINE_ACCEPTANCE: f"{_ACCEPTED} / {_DRAFT}",
        ENGINE_RUNNING: sum_by("trtllm_num_requests_running"),
        ENGINE_WAITING: sum_by("trtllm_num_requests_waiting"),
        ENGINE_KV_USAGE: max_by("trtllm_kv_cache_utilization"),
    }
    # connection refused until the model is loaded; then /health answers 200 (503 while unhealthy)

    @property
    def config_path(self) -> Path:
        return self.log_path.with_name(self.log_path.name.removesuffix(".log").removesuffix(".server") + ".trtllm.yaml")

    def options(self) -> dict[str, Any]:
        """The --config YAML: perf metrics on, no block reuse (TTFT means prompt processing), speculation."""
        s = self.spec
        opts: dict[str, Any] = {
            "return_perf_metrics": True,
            "enable_iter_perf_stats": True,
            "kv_cache_config": {"enable_block_reuse": False},
        }
        if s.speculative:
            spec: dict[str, Any] = {"decoding_type": DECODING_TYPES[s.algorithm]}
            if s.k is not None:
                spec["num_nextn_predict_layers" if s.algorithm == "draft-mtp" else "max_draft_len"] = s.k
            if s.draft is not None:
                spec["speculative_model_dir"] = str(s.draft)
            opts["speculative_config"] = spec
        return opts

    def start(self) -> None:
        self.refuse_unsupported()  # before the options file is written
        if not has_arg(self.spec.extra_args, "--config", "--extra_llm_api_options"):
            self.config_path.parent.mkdir(parents=True, exist_ok=True)
            self.config_path.write_text(yaml.safe_dump(self.options(), sort_keys=False), encoding="utf-8")
        super().start()

    def command(self) -> list[str]:
        s = self.spec
        exe = which("trtllm-serve", s.binary)
        if exe is None:
            raise self.not_installed("trtllm-serve")
        cmd = [exe, str(s.model), "--backend", "pytorch", "--host", s.host, "--port", str(s.port)]
        if not has_arg(s.extra_args, "--max_batch_size"):
            cmd += ["--max_batch_size", str(s.parallel)]
        if not has_arg(s.extra_args, "--max_seq_len"):
            cmd += ["--max_seq_len", str(max(1, s.ctx_size // s.parallel))]
        if not has_arg(s.extra_args, "--config", "--extra_llm_api_options"):
            cmd += ["--config", str(self.config_path)]
        cmd += list(s.extra_args)
        return cmd

    @classmethod
    def parse_startup_log(cls, text: str) -> Capacity:
        blocks = block_tokens = kv_tokens = ctx_slot = slots = n_max = None
        kv_mib = weights = None
        spec: str | None = None
        seen = False
        for line in startup_lines(text):
            if (m := _BLOCKS.search(line)) and blocks is None:
                blocks = int(m.group(1))
            elif (m := _BLOCK_TOKENS.search(line)) and block_tokens is None:
                block_tokens = int(m.group(1))
            elif (m := _KV_ALLOC.search(line)) and kv_mib is None:
                kv_mib, kv_tokens, seen = gib_mib(m.group(1)), int(m.group(2)), True
            elif (m := _WEIGHTS.search(line.rstrip())) and weights is None:
                weights, seen = gib_mib(m.group(1)), True
            if (m := _LIMITS.search(line)) and ctx_slot is None:
                ctx_slot, slots = int(m.group(1)), int(m.group(2))
            if (m := _SPEC.search(line)) and spec is None and m.group(1).upper() != "NONE":
                spec = m.group(1)
            if (m := _DRAFT_LEN.search(line)) and n_max is None:
                n_max = int(m.group(1))
        ctx_total = kv_tokens if kv_tokens is not None else (blocks * block_tokens if blocks and block_tokens else None)
        return Capacity(
            slots=slots,
            ctx_per_slot=ctx_slot,
            ctx_total=ctx_total,
            kv_unified=True if ctx_total is not None else None,
            target=MemoryUse(model_mib=weights, kv_mib=kv_mib, kv_cells=ctx_total),
            spec_types=(spec,) if spec else (),
            spec_n_max=n_max,
            fatal=tuple(cls._fatal_lines(text)),
            memory_lines_seen=seen,
            max_concurrency=round(ctx_total / ctx_slot, 2) if ctx_total and ctx_slot else None,
            kv_blocks=blocks,
            kv_block_tokens=block_tokens,
        )

    @classmethod
    def _fatal_lines(cls, text: str) -> list[str]:
        out = [ln.strip() for ln in text.splitlines() if _ERROR.search(ln)]
        exc = python_exception(text)
        if exc and not any(exc in ln for ln in out):
            out.append(exc)
        return out

    @classmethod
    def failure_reason(cls, log_text: str) -> str | None:
        exc = python_exception(log_text)
        if exc:
            return exc
        errors = [ln for ln in log_text.splitlines() if _ERROR.search(ln)]
        return _ERROR.split(errors[0], 1)[-1].strip() if errors else None

    def refuse_unsupported(self) -> None:
        super().refuse_unsupported()
        if self.spec.api_key and not self.spec.request_base_url:
            # the key would go to an engine that never checks it: the run would look protected and not be
            raise EngineStartError(
                "trtllm-serve takes no API key (no flag, no environment variable): unset server.api_key_env, "
                "or put an authenticating proxy in front of it and name it in server.request_base_url"
            )

    def check_speculation(self) -> None:
        """The Prometheus route must answer (return_perf_metrics), and the ``LLM Args:`` dump, when the
        log has it, must hold a speculative ``decoding_type`` (it prints ``speculative_config=None`` else)."""
        if not self.spec.speculative:
            return
        status, _ = self.http_get(self.metrics_path, timeout=10.0)
        if status != 200:
            raise ScrapeError(f"trtllm: GET {self.metrics_path} answered HTTP {status} (is return_perf_metrics set?)")
        log = self.read_log()
        if "LLM Args:" in log and not self.parse_startup_log(log).spec_types:
            raise SpeculationInactive(
                f"TensorRT-LLM serves without speculation although '{self.spec.algorithm}' was asked: "
                + (self.failure_reason(log) or "no decoding_type in its LLM Args")
            )

    def request_extras(self) -> dict[str, Any]:
        return {"model": str(self.spec.model)}

    @classmethod
    def normalise_metrics(cls, text: str) -> EngineCounters:
        s = Samples(text, cls.name)
        drafted_pos = s.per_label("trtllm_spec_decode_drafted_tokens_total", "token_position")
        accepted_pos = s.per_label("trtllm_spec_decode_accepted_tokens_total", "token_position")
        drafted = s.get("trtllm_spec_decode_num_draft_tokens_total")
        accepted = s.get("trtllm_spec_decode_num_accepted_tokens_total")
        gen = s.get("trtllm_generation_tokens_total")
        requests = s.get("trtllm_request_success_total", "trtllm_num_requests_completed_total")
        if drafted is None and drafted_pos:
            drafted = sum(drafted_pos)
        if accepted is None and accepted_pos:
            accepted = sum(accepted_pos)
        verify: float | None = None
        if drafted_pos:
            verify = drafted_pos[0]
        elif accepted is not None and gen is not None and requests is not None:
            verify = 0.0 if not drafted else gen - accepted - requests
        return EngineCounters(
            prompt_tokens=s.get("trtllm_prompt_tokens_total"),
            output_tokens=gen,
            draft_tokens=drafted,
            accepted_tokens=accepted,
            verify_steps=verify,
            accepted_per_position=accepted_pos,
            requests_processing=s.get("trtllm_num_requests_running"),
            requests_deferred=s.get("trtllm_num_requests_waiting"),
        )

    def scrape(self) -> EngineCounters:
        return for_configuration(super().scrape(), self.spec.speculative, None)

    @classmethod
    def classify_error(cls, status: int, body: str) -> str | None:
        return classify_context_overflow(status, body, ("max_num_tokens", "max_seq_len", "exceed"))

    @classmethod
    def installed_version(cls) -> str | None:
        return dist_version("tensorrt_llm", "tensorrt-llm")

    @classmethod
    def validate_warnings(cls, configuration: Any, server: Any) -> list[str]:
        out = []
        if configuration.is_synthetic:
            out.append("TensorRT-LLM has no synthetic acceptance: the configuration fails at start")
        if configuration.speculative and configuration.k is None and configuration.algorithm != "draft-mtp":
            out.append("no 'k': TensorRT-LLM needs max_draft_len for this decoding type")
        if any(a in ("--config", "--extra_llm_api_options") for a in server.extra_args + configuration.engine_args):
            out.append("your own --config replaces the harness's: keep return_perf_metrics: true in it")
        if getattr(server, "api_key_env", None) and not getattr(server, "request_base_url", None):
            out.append(
                "trtllm-serve takes no API key: server.api_key_env without a proxy (server.request_base_url) fails at start"
            )
        return out
