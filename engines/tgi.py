"""Hugging Face TGI (``text-generation-launcher``, maintenance mode): command line, log, /metrics.

Formats: read off TGI main's source (maintenance mode); no real capture (tests/fixtures/tgi/README.md).
TGI speculates with Medusa heads when the model has them, else with n-gram lookup, whenever ``--speculate N`` is given.

Counters: TGI records ``tgi_request_skipped_tokens`` once per generation step of each request
with the tokens that step produced minus one: 0 for the prefill step, the accepted drafts for a
decode step. So over a phase ``accepted = _sum``, ``verify_steps = _count - requests``
(``tgi_request_generated_tokens_count``, one observation per finished request) and
``1 + accepted / verify_steps`` is docs/metrics.md's mean length. TGI drafts exactly N tokens per
step, so ``draft_tokens = verify_steps * N``.

Where each log line and metric name comes from in TGI's source: tests/fixtures/tgi/README.md.
The launcher prints its ``Args`` with ``{:#?}`` (one field a line, ``Some(\n    2,\n)``) since
TGI 2.0.2, on one line before. ``/info`` has no ``speculate`` field, so whether TGI speculates is
read from the shard's "Using speculation ..." line. The API key goes in the launcher's environment
(``API_KEY``); the launcher hands it on to its router as ``--api-key``.
"""

from __future__ import annotations

import re
from typing import Any, ClassVar

from engines._common import (
    Samples,
    dist_version,
    for_configuration,
    has_arg,
    python_exception,
    which,
)
from engines.base import SHARED_FIELDS, Engine
from engines.errors import SpeculationInactive
from engines.promql import (
    ENGINE_ACCEPTED_TOKENS,
    ENGINE_RUNNING,
    ENGINE_VERIFY_STEPS,
    ENGINE_WAITING,
    r1,
    sum_by,
)
from engines.types import Capacity, EngineCounters, MemoryUse, startup_lines

_LEVEL = re.compile(r"^\S*\s+(TRACE|DEBUG|INFO|WARN|ERROR)\s+(.*)$")
_ARGS = re.compile(r"\bArgs\s*\{")
_OPT = r"(?:Some\(\s*)?(\d+),?\s*\)?"
_A_SPECULATE = re.compile(rf"\bspeculate:\s*{_OPT}")
_A_BATCH = re.compile(rf"\bmax_batch_size:\s*{_OPT}")
_A_TOTAL = re.compile(rf"\bmax_total_tokens:\s*{_OPT}")
_A_CONCURRENT = re.compile(r"\bmax_concurrent_requests:\s*(\d+)")
# TGI < 3 (launcher) / TGI 3 (router v3)
_DEFAULT_TOTAL = re.compile(r"(?:Default `max_total_tokens` to|Maximum total tokens defaulted to) (\d+)")
_BLOCKS = re.compile(r"KV-cache blocks:\s*(\d+),\s*size:\s*(\d+)")
_BATCH_TOTAL = re.compile(r"Setting max batch total tokens to (\d+)")
_USING_SPEC = re.compile(r"Using speculation (\w+) with (\d+) input ids")
_ERROR_LINE = re.compile(r"^Error:\s*(.+)$")
_VALIDATION_TOKENS = ("must be <=", "tokens", "max_total_tokens", "max_input")


class Tgi(Engine):
    name: ClassVar[str] = "tgi"
    methods: ClassVar[frozenset[str]] = frozenset({"none", "ngram", "draft-medusa"})
    model_folders: ClassVar[bool] = True
    synthetic_acceptance: ClassVar[bool] = False
    install_hint: ClassVar[str] = "TGI's container image, or set server.binary to text-generation-launcher"
    typical_start_s: ClassVar[float | None] = 60.0
    honoured_fields: ClassVar[dict[str, str]] = {
        **SHARED_FIELDS,
        "server.binary": "`text-generation-launcher`; default: on PATH",
        "server.model": "`--model-id` (a folder)",
        "server.ctx_size": "`--max-total-tokens` = ctx_size / parallel, `--max-input-tokens` one less",
        "server.parallel": "only divides ctx_size (TGI batches by tokens)",
        "server.api_key_env": "`API_KEY` in the launcher's environment",
        "configurations[].algorithm": "`--speculate` (Medusa heads when the model has them, else n-gram)",
        "configurations[].k": "`--speculate`",
    }
    promql_series: ClassVar[dict[str, str]] = {
        # tgi_request_skipped_tokens: one observation per generation step (0 at prefill), the accepted drafts
        ENGINE_ACCEPTED_TOKENS: r1("tgi_request_skipped_tokens_sum"),
        ENGINE_VERIFY_STEPS: f"{r1('tgi_request_skipped_tokens_count')} - {r1('tgi_request_generated_tokens_count')}",
        ENGINE_RUNNING: sum_by("tgi_batch_current_size"),
        ENGINE_WAITING: sum_by("tgi_queue_size"),
    }
    # the router binds its port only after the shards warmed up; /health then answers 200

    def command(self) -> list[str]:
        s = self.spec
        exe = which("text-generation-launcher", s.binary)
        if exe is None:
            raise self.not_installed("text-generation-launcher")
        cmd = [exe, "--model-id", str(s.model), "--hostname", s.host, "--port", str(s.port)]
        per_request = max(2, s.ctx_size // s.parallel)
        if not has_arg(s.extra_args, "--max-total-tokens"):
            cmd += ["--max-total-tokens", str(per_request)]
        if not has_arg(s.extra_args, "--max-input-tokens", "--max-input-length"):
            cmd += ["--max-input-tokens", str(per_request - 1)]
        if s.speculative and s.k is not None:
            cmd += ["--speculate", str(s.k)]
        cmd += list(s.extra_args)
        return cmd

    @classmethod
    def parse_startup_log(cls, text: str) -> Capacity:
        speculate = slots = ctx_slot = blocks = block_tokens = batch_total = None
        spec: str | None = None
        notes: list[str] = []
        for line in _args_joined(startup_lines(text)):
            if _ARGS.search(line):
                if m := _A_SPECULATE.search(line):
                    speculate = int(m.group(1))
                if m := _A_BATCH.search(line):
                    slots = int(m.group(1))
                if m := _A_TOTAL.search(line):
                    ctx_slot = int(m.group(1))
                if m := _A_CONCURRENT.search(line):
                    notes.append(f"max_concurrent_requests = {m.group(1)}: TGI answers 429 beyond it")
            elif (m := _DEFAULT_TOTAL.search(line)) and ctx_slot is None:
                ctx_slot = int(m.group(1))
            elif m := _BLOCKS.search(line):
                blocks, block_tokens = int(m.group(1)), int(m.group(2))
            elif m := _BATCH_TOTAL.search(line):
                batch_total = int(m.group(1))
            elif m := _USING_SPEC.search(line):
                spec, speculate = m.group(1), int(m.group(2))
        if spec is None and speculate:
            spec = "speculate"
        ctx_total = blocks * block_tokens if blocks and block_tokens else batch_total
        return Capacity(
            slots=slots,
            ctx_per_slot=ctx_slot,
            ctx_total=ctx_total,
            kv_unified=True if ctx_total is not None else None,
            target=MemoryUse(kv_cells=ctx_total),
            spec_types=(spec,) if spec else (),
            spec_n_max=speculate,
            fatal=tuple(cls._fatal_lines(text)),
            memory_lines_seen=False,  # TGI's log says no MiB figure
            max_concurrency=round(ctx_total / ctx_slot, 2) if ctx_total and ctx_slot else None,
            kv_blocks=blocks,
            kv_block_tokens=block_tokens,
            notes=tuple(notes),
        )

    @classmethod
    def _fatal_lines(cls, text: str) -> list[str]:
        out = []
        for line in text.splitlines():
            m = _LEVEL.match(line.strip())
            if (m and m.group(1) == "ERROR") or _ERROR_LINE.match(line.strip()):
                out.append(line.strip())
        exc = python_exception(text)
        if exc and not any(exc in ln for ln in out):
            out.append(exc)
        return out

    @classmethod
    def failure_reason(cls, log_text: str) -> str | None:
        exc = python_exception(log_text)  # a shard's Python error, inside the launcher's report
        if exc:
            return exc
        for line in log_text.splitlines():
            m = _LEVEL.match(line.strip())
            if m and m.group(1) == "ERROR":
                return m.group(2).strip()
        for line in log_text.splitlines():
            if m := _ERROR_LINE.match(line.strip()):
                return "Error: " + m.group(1)
        return None

    def check_speculation(self) -> None:
        """The shard logs "Using speculation {method} with {n} input ids." only when it speculates
        (TGI's /info has no speculate field)."""
        if not self.spec.speculative:
            return
        log = self.read_log()
        if not any(_USING_SPEC.search(ln) for ln in log.splitlines()):
            raise SpeculationInactive(
                f"TGI serves without speculation although '{self.spec.algorithm}' was asked: "
                "no 'Using speculation' line in its log"
            )

    def engine_env(self) -> dict[str, str]:
        # the launcher's `api_key` option is `#[clap(long, env)]`: it reads API_KEY (README cites it)
        return {"API_KEY": self.spec.api_key} if self.spec.api_key else {}

    def request_extras(self) -> dict[str, Any]:
        return {"model": "tgi"}  # TGI serves one model and ignores the name

    @classmethod
    def normalise_metrics(cls, text: str) -> EngineCounters:
        s = Samples(text, cls.name)
        steps = s.get("tgi_request_skipped_tokens_count")
        accepted = s.get("tgi_request_skipped_tokens_sum")
        requests = s.get("tgi_request_generated_tokens_count")
        verify = steps - requests if steps is not None and requests is not None else None
        return EngineCounters(
            prompt_tokens=s.get("tgi_request_input_length_sum"),
            output_tokens=s.get("tgi_request_generated_tokens_sum"),
            accepted_tokens=accepted,
            verify_steps=verify,
            requests_processing=s.get("tgi_batch_current_size"),
            requests_deferred=s.get("tgi_queue_size"),
        )

    def scrape(self) -> EngineCounters:
        return for_configuration(super().scrape(), self.spec.speculative, self.spec.k)

    @classmethod
    def classify_error(cls, status: int, body: str) -> str | None:
        low = body.lower()
        if "overloaded" in low:
            return "overload"
        if (status == 422 or "validation" in low) and any(p in low for p in _VALIDATION_TOKENS):
            return "context_overflow"
        return None

    @classmethod
    def installed_version(cls) -> str | None:
        return dist_version("text-generation-server", "text-generation")

    @classmethod
    def validate_warnings(cls, configuration: Any, server: Any) -> list[str]:
        out = []
        if configuration.speculative and configuration.k is None:
            out.append("no 'k': TGI speculates only with --speculate N (Medusa models: N defaults to their heads)")
        if configuration.is_synthetic:
            out.append("TGI has no synthetic acceptance: the configuration fails at start")
        out.append("TGI's chat route has no ignore_eos: a request may stop before max_tokens (compare output_tokens)")
        return out


def _args_joined(lines: list[str]) -> list[str]:
    """The launcher's pretty-printed ``Args {`` block (one field a line, up to a line ``}``) joined
    into one line, so the same patterns read it and the single-line form of older TGI."""
    out: list[str] = []
    block: list[str] | None = None
    for line in lines:
        if block is None:
            if _ARGS.search(line) and not line.rstrip().endswith("}"):
                block = [line.rstrip()]
            else:
                out.append(line)
        else:
            block.append(line.strip())
            if line.strip() == "}":
                out.append(" ".join(block))
                block = None
    if block is not None:
        out.append(" ".join(block))
    return out
