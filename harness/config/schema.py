"""The scenario file's schema: pydantic models (extra fields refused, frozen) and the names they check.

Loading a file into them is harness.config.loader; checks that need the prompt files, traces or the workshop are
harness.config.checks.
"""

from __future__ import annotations

import itertools
import re
from typing import Annotated, Any, Literal, cast

from pydantic import BaseModel, ConfigDict, Field, StringConstraints, field_validator, model_validator

from harness.config.policy import DEFAULT_ACTIONS, VerdictAction, VerdictKind

NAME_PATTERN = r"^[A-Za-z0-9][A-Za-z0-9_.-]{0,63}$"

# Algorithm families, engine-neutral. Each engine adapter says which of them it implements.
ALGORITHMS = frozenset(
    {
        "none",
        "draft-simple",
        "draft-mtp",
        "draft-eagle3",
        "draft-dflash",
        "draft-dspark",
        "ngram-simple",
        "ngram-map-k",
        "ngram-map-k4v",
        "ngram-mod",
        "ngram-cache",
        "ngram",  # prompt lookup as vLLM, SGLang, TRT-LLM and TGI name it (llama.cpp: ngram-simple and kin)
        "ngram-gpu",  # vLLM's ngram_gpu
        "suffix",
        "draft-medusa",  # TGI: Medusa heads that come with the target model (like draft-mtp)
    }
)
# The engines a scenario may name; tests/unit/test_engines_registry.py checks it equals engines.ENGINES.
ENGINE_NAMES = ("llamacpp", "vllm", "sglang", "trtllm", "tgi")
EngineName = Literal["llamacpp", "vllm", "sglang", "trtllm", "tgi"]
DRAFT_MODEL_ALGORITHMS = frozenset({"draft-simple", "draft-eagle3", "draft-dflash", "draft-dspark"})


def _ipv4(field: str, v: str, hint: str = "") -> str:
    """``v`` when it is an IPv4 literal (the engine URL and free_port are IPv4), else the error naming ``field``."""
    import ipaddress

    try:
        ipaddress.IPv4Address(v)
    except ValueError:
        raise ValueError(f"{field} {v!r} is not an IPv4 address{hint}") from None
    return v


class _Strict(BaseModel):
    model_config = ConfigDict(extra="forbid", frozen=True)


class Synthetic(_Strict):
    """The engine's synthetic acceptance: a cost measurement, never valid model output."""

    length: float | None = Field(None, description="mean acceptance length L, within [1, K+1]")
    rates: list[Annotated[float, Field(ge=0.0, le=1.0)]] | None = Field(
        None, description="per-position acceptance rates, K values, non-increasing"
    )

    @model_validator(mode="after")
    def _one_of(self) -> Synthetic:
        if (self.length is None) == (self.rates is None):
            raise ValueError("set exactly one of 'length' or 'rates'")
        if self.rates is not None and any(b > a for a, b in itertools.pairwise(self.rates)):
            raise ValueError(f"rates must be non-increasing, got {self.rates}")
        return self


class Sweep(_Strict):
    """Run one configuration at several draft lengths (and synthetic lengths): the K sweep."""

    k: list[Annotated[int, Field(ge=1, le=64)]] = Field(
        min_length=1, max_length=64, description="draft lengths, distinct: one configuration NAME-kK per value"
    )
    synthetic_length: list[Annotated[float, Field(ge=1.0)]] | None = Field(
        None, description="with k: every combination is run; each length must be within [1, k+1]"
    )

    @field_validator("k")
    @classmethod
    def _distinct_k(cls, v: list[int]) -> list[int]:
        if len(set(v)) != len(v):
            raise ValueError(f"k values must be distinct, got {v}")
        return sorted(v)


class Configuration(_Strict):
    name: str = Field(
        pattern=NAME_PATTERN, description="unique in the scenario: names its records, logs and report rows"
    )
    algorithm: str = Field("none", description="speculative algorithm family; 'none' is a baseline")
    model: str | None = Field(None, description="target model; defaults to the scenario's server.model")
    draft: str | None = Field(None, description="draft model (draft-simple, draft-eagle3, draft-dflash)")
    k: int | None = Field(None, ge=1, le=64, description="draft length K (max drafted tokens per step)")
    k_min: int | None = Field(
        None,
        ge=0,
        le=64,
        description="minimum draft length: llama.cpp skips speculation for a step that could draft fewer (--spec-draft-n-min)",
    )
    synthetic: Synthetic | None = Field(
        None, description="replace the accept decision by draws (a cost measurement; output is not valid)"
    )
    engine_args: list[str] = Field(default_factory=list, description="extra engine arguments, as a list")
    sweep: Sweep | None = Field(None, description="expand into one configuration per k (and synthetic length)")
    sweep_of: str | None = Field(None, description="set by the sweep expansion: the configuration this one came from")
    baseline: str | None = Field(
        None,
        description="the 'none' configuration its speedups are against; default: the one serving the same target model",
    )

    @field_validator("algorithm")
    @classmethod
    def _known(cls, v: str) -> str:
        if v not in ALGORITHMS:
            raise ValueError(f"unknown algorithm '{v}'; known: {', '.join(sorted(ALGORITHMS))}")
        return v

    @model_validator(mode="after")
    def _coherent(self) -> Configuration:
        if self.algorithm in DRAFT_MODEL_ALGORITHMS and not self.draft:
            raise ValueError(f"algorithm '{self.algorithm}' needs a 'draft' model")
        if self.algorithm not in DRAFT_MODEL_ALGORITHMS and self.draft:
            raise ValueError(f"algorithm '{self.algorithm}' takes no 'draft' model")
        if self.synthetic is not None:
            if self.algorithm == "none":
                raise ValueError("synthetic acceptance needs a speculative algorithm, not 'none'")
            if self.k is None:
                raise ValueError("synthetic acceptance needs an explicit 'k' to be checked against")
            s = self.synthetic
            if s.length is not None and not 1.0 <= s.length <= self.k + 1:
                raise ValueError(f"synthetic.length must be within [1, k+1] = [1, {self.k + 1}], got {s.length}")
            if s.rates is not None and len(s.rates) != self.k:
                raise ValueError(f"synthetic.rates must have k = {self.k} values, got {len(s.rates)}")
        if self.k_min is not None and self.k is not None and self.k_min > self.k:
            raise ValueError(f"k_min ({self.k_min}) must not exceed k ({self.k})")
        if self.sweep is not None:
            if self.algorithm == "none":
                raise ValueError("a sweep needs a speculative algorithm, not 'none'")
            if self.synthetic is not None and self.synthetic.rates is not None:
                raise ValueError(
                    "sweep.k cannot be combined with synthetic.rates (their count is k); use synthetic.length"
                )
            swept: list[float | None] = list(self.sweep.synthetic_length or [])
            for k in self.sweep.k:
                for length in swept or ([self.synthetic.length] if self.synthetic else []):
                    if length is not None and not 1.0 <= length <= k + 1:
                        raise ValueError(
                            f"sweep: synthetic length {length:g} is outside [1, k+1] = [1, {k + 1}] for k = {k}"
                        )
        return self

    def expand(self) -> list[Configuration]:
        """The configurations a sweep stands for (itself when it has no sweep)."""
        if self.sweep is None:
            return [self]
        out = []
        lengths: list[float | None] = list(self.sweep.synthetic_length) if self.sweep.synthetic_length else [None]
        for k in self.sweep.k:
            for length in lengths:
                synthetic = Synthetic(length=length) if length is not None else self.synthetic
                name = f"{self.name}-k{k}" + (f"-L{length:g}" if length is not None else "")
                data = self.model_dump(exclude={"sweep", "synthetic", "name", "k", "sweep_of"})  # baseline, model kept
                out.append(Configuration(**data, name=name, k=k, synthetic=synthetic, sweep_of=self.name))
        return out

    @property
    def speculative(self) -> bool:
        return self.algorithm != "none"

    @property
    def is_synthetic(self) -> bool:
        return self.synthetic is not None


class Server(_Strict):
    engine: EngineName = Field(
        "llamacpp", description="the engine adapter that starts and reads the server (engines/*.py)"
    )
    binary: str | None = Field(
        None, description="the engine's executable (or the Python that runs it); the default depends on the engine"
    )
    model: str | None = Field(
        None,
        description="target model: a path, or package:DIST/FILE; attach mode (server.url): optional, "
        "the model the server lists first at /v1/models",
    )
    ctx_size: int = Field(8192, ge=256, le=4_194_304, description="total context (all slots)")
    parallel: int = Field(4, ge=1, le=1024, description="server slots")
    threads: int | None = Field(
        None, ge=1, le=1024, description="CPU threads of llama-server (-t); default: llama.cpp's own choice"
    )
    extra_args: list[str] = Field(
        default_factory=list, description="extra engine arguments for every configuration, as a list"
    )
    start_timeout_s: float = Field(
        180.0,
        gt=0,
        le=3600,
        description="start to ready (health answers 200) at most; past it the start fails as a hang",
    )
    request_timeout_s: float = Field(
        300.0,
        gt=0,
        le=86_400,
        description="one request, first byte to last, at most; past it the request fails as 'timeout'",
    )
    stop_grace_s: float = Field(
        10.0, ge=0, le=600, description="after SIGTERM, the engine's process group gets this long before SIGKILL"
    )
    port: int | None = Field(
        None, ge=1024, le=65535, description="engine port (default: a free ephemeral one per start)"
    )
    host: str = Field(
        "127.0.0.1",
        description="address the engine binds, an IPv4 literal (anything but loopback is your explicit choice: Locust "
        "workers on other hosts send to it, soak.remote_workers)",
    )
    request_base_url: str | None = Field(
        None,
        pattern=r"^https?://[^\s/]+(:\d+)?/?$",
        description="send requests here instead of to the engine (a proxy in between)",
    )
    api_key_env: str | None = Field(
        None, pattern=r"^[A-Za-z_][A-Za-z0-9_]*$", description="environment variable holding the engine's API key"
    )
    env: dict[Annotated[str, StringConstraints(pattern=r"^[A-Za-z_][A-Za-z0-9_]*$")], str | int | float] = Field(
        default_factory=dict,
        description="environment of the engine process (e.g. VLLM_CPU_KVCACHE_SPACE: 1); no secrets: it is stored in the manifest",
    )
    url: str | None = Field(
        None,
        pattern=r"^https?://[^\s/]+(:\d+)?/?$",
        description="attach mode: measure the server already running here (specsoak never starts, restarts or stops it); "
        "one configuration, whose algorithm is checked against what the server reports where the engine exposes it",
    )
    metrics_url: str | None = Field(
        None,
        pattern=r"^https?://\S+$",
        description="attach mode: the server's Prometheus metrics (default: url + the engine's metrics path)",
    )
    log_file: str | None = Field(
        None,
        description="attach mode: the server's log, read for its capacity (slots, context, memory); default: none "
        "(llama.cpp: slots and context from /slots)",
    )

    @field_validator("host")
    @classmethod
    def _ip(cls, v: str) -> str:
        return _ipv4("server.host", v, " (e.g. 127.0.0.1, or the address other hosts reach)")

    @model_validator(mode="after")
    def _attach(self) -> Server:
        if self.url is None and self.model is None:
            raise ValueError(
                "server.model is required: the model to launch (with server.url, attaching to a running server, "
                "it is read from the server)"
            )
        if self.url is None:
            for f in ("metrics_url", "log_file"):
                if getattr(self, f) is not None:
                    raise ValueError(f"{f} is for attach mode: set server.url too")
            return self
        launch_only = [
            f
            for f in ("binary", "ctx_size", "parallel", "threads", "extra_args", "port", "host", "env", "stop_grace_s")
            if f in self.model_fields_set
        ]
        if launch_only:
            raise ValueError(
                f"server.url attaches to a running server, which specsoak does not start: {', '.join(launch_only)} "
                f"cannot apply (set them where the server is launched); remove them"
            )
        return self


class Stage(_Strict):
    """One stretch of an open-loop schedule: arrivals at ``rate_rps`` for ``duration_s``."""

    rate_rps: float = Field(gt=0, le=100_000, description="mean arrival rate during the stage")
    duration_s: float = Field(
        gt=0, le=7 * 86_400, description="how long the stage lasts; the next starts where it ends"
    )


ArrivalKind = Literal["constant", "poisson", "gamma"]


class Saturation(_Strict):
    """When an open-loop rate counts as past what a configuration serves (harness/detect/saturation.py): the report's
    saturation point per configuration, and, with ``stop_after``, an adaptive sweep that skips the higher rates."""

    completion_ratio_min: float = Field(
        0.9,
        gt=0,
        le=1,
        description="saturated when responses complete at less than this share of the rate the requests "
        "were scheduled at (completion rate over the first-to-last completion against scheduled rate over the first-to-last send)",
    )
    late_share_max: float = Field(
        0.1,
        ge=0,
        le=1,
        description="saturated when more than this share of the requests was sent late because every "
        "`max_in_flight` slot was taken (a send the client made late with a slot free does not count)",
    )
    goodput_ratio_min: float = Field(
        0.9,
        ge=0,
        le=1,
        description="with an `slo:`: saturated (the SLO broke) when fewer than this share of the requests met it",
    )
    stop_after: int | None = Field(
        None,
        ge=1,
        le=64,
        description="adaptive sweep: once this many rates in a row saturated in a repetition, that "
        "configuration skips the higher rates of the repetition (none: every rate is measured)",
    )


def rate_key(rate_rps: float) -> str:
    """An open-loop phase's key for one rate: its phase records' ``load`` (the report shows it as '@R rps')."""
    return f"{rate_rps:g}rps"


STAGES_KEY = "stages"  # the ``load`` of the phase that runs a stage list


def load_label(key: str) -> str:
    """An open-loop phase's key as the report and the console show it: '2rps' -> '@2 rps'; 'stages' as it is."""
    return f"@{key[:-3]} rps" if key.endswith("rps") else key


class Arrival(_Strict):
    """Open-loop arrivals (harness/load/arrivals.py): each request is sent at its scheduled time whatever the answers
    before it, up to ``max_in_flight`` at once; one waiting for a slot is recorded late, with its delay."""

    kind: ArrivalKind = Field(
        "poisson",
        description="gaps between arrivals: constant (exactly 1/rate), poisson (exponential, mean 1/rate), "
        "gamma (mean 1/rate, coefficient of variation cv: above 1 bursty, below 1 regular)",
    )
    rate_rps: list[Annotated[float, Field(gt=0, le=100_000)]] | None = Field(
        None,
        min_length=1,
        max_length=64,
        description="a rate or a list of distinct rates (requests per second): one phase each, `requests` requests long",
    )
    stages: list[Stage] | None = Field(
        None,
        min_length=1,
        max_length=10_000,
        description="instead of rate_rps: one phase that runs these stages in order (rate × duration)",
    )
    cv: float | None = Field(
        None, gt=0, le=100, description="gamma only (and required there): coefficient of variation of the gaps"
    )
    requests: int = Field(
        32,
        ge=1,
        le=1_000_000,
        description="requests per phase at each rate_rps (with stages, the stages' durations set the count)",
    )
    max_in_flight: int = Field(
        64,
        ge=1,
        le=65_536,
        description="requests in flight at most; a request due while this many are in flight waits for a slot "
        "and is recorded late with its send delay",
    )
    seed: int = Field(
        0, description="seed of the gaps: phase (rate, repetition) has the same schedule in every configuration"
    )
    saturation: Saturation = Field(
        default_factory=Saturation,
        description="when a rate counts as saturated (the report's saturation point; `stop_after`: adaptive sweep)",
    )

    @field_validator("rate_rps", mode="before")
    @classmethod
    def _one_rate(cls, v: Any) -> Any:
        return [v] if isinstance(v, (int, float)) and not isinstance(v, bool) else v

    @field_validator("rate_rps")
    @classmethod
    def _distinct_rates(cls, v: list[float] | None) -> list[float] | None:
        if v is None:
            return v
        keys = [rate_key(r) for r in v]
        if len(set(keys)) != len(keys):
            raise ValueError(f"rates must be distinct (to 6 significant digits), got {v}")
        return sorted(v)

    @model_validator(mode="after")
    def _coherent(self) -> Arrival:
        if (self.rate_rps is None) == (self.stages is None):
            raise ValueError(
                "set exactly one of 'rate_rps' (one phase per rate) or 'stages' (one phase running them in order)"
            )
        if self.stages is not None and "requests" in self.model_fields_set:
            raise ValueError(
                "'requests' is for rate_rps: with stages, each stage's rate × duration sets the count; remove 'requests'"
            )
        if self.kind == "gamma" and self.cv is None:
            raise ValueError(
                "kind 'gamma' needs 'cv', the coefficient of variation of the gaps (1 is as bursty as poisson)"
            )
        if self.stages is not None and self.saturation.stop_after is not None:
            raise ValueError(
                "'saturation.stop_after' sweeps a list of rates (rate_rps); a stage list is one phase: remove it"
            )
        if self.kind != "gamma" and self.cv is not None:
            raise ValueError(
                f"'cv' is for kind 'gamma'; kind '{self.kind}' has a fixed one (constant 0, poisson 1): remove 'cv'"
            )
        return self

    def keys(self) -> list[str]:
        """The ``load`` of each open-loop phase, in the order they run: one per rate, or 'stages'."""
        return [rate_key(r) for r in self.rate_rps] if self.rate_rps is not None else [STAGES_KEY]

    def rate_of(self, key: str) -> float | None:
        """The rate a key stands for (None for the stage list)."""
        return next((r for r in self.rate_rps or [] if rate_key(r) == key), None)

    def expected_span_s(self, key: str) -> float:
        """How long the phase's schedule lasts on average: requests / rate, or the stages' total duration."""
        rate = self.rate_of(key)
        if rate is not None:
            return self.requests / rate
        return sum(s.duration_s for s in self.stages or [])


# ---- realistic prompts: synthetic lengths, shared prefix, prompt reuse (harness/prompts/lengths.py) ----------------
class LengthDist(_Strict):
    """A distribution of lengths in the target's tokens. normal and lognormal take the lengths' own mean and sd
    (lognormal: sigma² = ln(1 + sd²/mean²), mu = ln(mean) − sigma²/2); draws are rounded and clipped to [min, max]."""

    dist: Literal["fixed", "normal", "lognormal", "uniform"] = Field(
        description="fixed: every length is mean; uniform: integers in [min, max]"
    )
    mean: float | None = Field(
        None, gt=0, le=1_048_576, description="fixed, normal, lognormal: the mean length, tokens"
    )
    sd: float | None = Field(
        None, ge=0, le=1_048_576, description="normal, lognormal: the standard deviation of the lengths, tokens"
    )
    min: int = Field(1, ge=1, le=1_048_576, description="shortest length; draws below it are raised to it")
    max: int | None = Field(
        None, ge=1, le=1_048_576, description="longest length; draws above it are cut to it (uniform: required)"
    )

    @model_validator(mode="after")
    def _params(self) -> LengthDist:
        need = {"fixed": ("mean",), "normal": ("mean", "sd"), "lognormal": ("mean", "sd"), "uniform": ("max",)}[
            self.dist
        ]
        missing = [f for f in need if getattr(self, f) is None]
        if missing:
            raise ValueError(f"dist '{self.dist}' needs {' and '.join(missing)}")
        if self.max is not None and self.max < self.min:
            raise ValueError(f"max ({self.max}) is below min ({self.min})")
        return self


class Lengths(_Strict):
    """Prompts built from the prompt set's text at drawn lengths (docs/scenarios.md#synthetic-lengths)."""

    input: LengthDist | None = Field(
        None,
        description="user-turn length, counted in the target's tokens via the engine's /tokenize; each prompt is a distinct "
        "window of the prompt set's text; unset: the set's prompts as they are (their followups kept)",
    )
    output: LengthDist | None = Field(
        None, description="answer length: each request's max_tokens (ignore_eos holds it); unset: max_tokens"
    )
    shared_prefix_tokens: int = Field(
        0,
        ge=0,
        le=1_048_576,
        description="a system prompt of this many tokens, the same in every request (prefix-cache traffic); 0: none",
    )
    prompts: int | None = Field(
        None,
        ge=1,
        le=10_000_000,
        description="how many prompts to build; default: as many as the measured phases send (soak: 5000)",
    )
    seed: int = Field(
        0, description="seed of the draws and of where each window starts: the same prompts in every configuration"
    )


PromptReuse = Literal["allow", "forbid"]
# ---- end of the realistic prompts block -------------------------------------------------------------------------


class MeasureVerify(_Strict):
    """`specsoak verify` inside the run, on each configuration's own engine once its phases are measured: greedy answers
    of every speculative configuration against its baseline's (harness/run/verify.py), no extra engine start."""

    prompts: int = Field(4, ge=1, le=1000, description="the first N prompts of measurement.prompts")
    streams: int | None = Field(
        None,
        ge=1,
        le=4096,
        description="concurrent streams of the batched comparison (default: the largest of measurement.streams)",
    )
    max_tokens: int | None = Field(
        None, ge=1, le=131_072, description="tokens per answer (default: measurement.max_tokens)"
    )


class Measurement(_Strict):
    prompts: str = Field(
        "builtin:repeat",
        description="builtin:NAME or a JSONL/JSON file of prompts; a prompt longer than one slot with its answer is left "
        "out and the next one taken (counted with the engine's tokenizer, the run folder's prompts/ says which)",
    )
    max_tokens: int = Field(
        128, ge=1, le=131_072, description="tokens per answer (requests ask ignore_eos: every answer is this long)"
    )
    streams: list[Annotated[int, Field(ge=1, le=4096)]] = Field(
        default_factory=lambda: [1, 4], min_length=1, description="concurrent stream counts, one phase each; 1 is solo"
    )
    requests_per_stream: int = Field(
        2,
        ge=1,
        le=100_000,
        description="requests each stream sends in a phase (a phase at N streams sends N times this)",
    )
    repetitions: int = Field(
        1, ge=1, le=1000, description="times each phase is measured: the confidence intervals come from them"
    )
    warmup_requests: int = Field(
        1, ge=0, le=1000, description="requests on one stream before the measured phases on each engine, not measured"
    )
    temperature: float = Field(0.0, ge=0.0, le=5.0, description="sampling temperature of every request; 0 is greedy")
    seed: int = Field(
        42, description="sampling seed: request i of a phase asks seed + i, the same in every configuration"
    )
    contamination_cores: float = Field(
        0.05, gt=0, le=64, description="other processes' mean CPU (cores) above which a figure is contaminated"
    )
    design: Literal["interleaved", "sequential"] = Field(
        "interleaved",
        description="interleaved: each repetition is a block that measures every configuration once, in an order shuffled per "
        "block (a fresh engine per block), so paired figures are seconds apart; sequential: all repetitions of one "
        "configuration, then the next (one engine per configuration)",
    )
    order_seed: int | None = Field(
        None,
        description="seed of the interleaved blocks' shuffled order (default: drawn at the start and recorded in the manifest)",
    )
    control_drift_max: float = Field(
        0.20,
        gt=0,
        le=10,
        description="the control (each baseline's solo decode t/s, block by block) may spread this much ((max − min) / median) "
        "before the report flags the machine's speed as drifting",
    )

    lengths: Lengths | None = Field(
        None, description="synthetic input/output lengths and a shared prefix, built from the prompt set's text"
    )
    prompt_reuse: PromptReuse = Field(
        "allow",
        description="forbid: the measured phases of a configuration never send one prompt twice (validate fails when the "
        "set is too small, naming the count needed); allow: prompts wrap around",
    )
    arrival: Arrival | None = Field(
        None,
        description="open-loop phases instead of closed-loop streams: requests sent at scheduled times "
        "(docs/metrics.md#open-loop-phases); streams and requests_per_stream are then not set",
    )
    verify: MeasureVerify | None = Field(
        None,
        description="greedy output of each speculative configuration compared with its baseline's on the engines the "
        "measurement started (verify.jsonl, as `specsoak verify` writes it)",
    )

    @field_validator("streams")
    @classmethod
    def _distinct(cls, v: list[int]) -> list[int]:
        if len(set(v)) != len(v):
            raise ValueError(f"stream counts must be distinct, got {v}")
        return sorted(v)

    @model_validator(mode="after")
    def _open_or_closed(self) -> Measurement:
        if self.arrival is not None:
            closed = [f for f in ("streams", "requests_per_stream") if f in self.model_fields_set]
            if closed:
                raise ValueError(
                    f"{' and '.join(closed)} {'is' if len(closed) == 1 else 'are'} for closed-loop phases; with 'arrival' "
                    f"the phases are open-loop (their concurrency is arrival.max_in_flight): remove "
                    f"{' and '.join('measurement.' + f for f in closed)}"
                )
        return self

    def phase_loads(self) -> list[int | str]:
        """What each measured phase runs, in order: a stream count (closed loop) or an arrival key (open loop)."""
        return list(self.arrival.keys()) if self.arrival is not None else list(self.streams)


class Shape(_Strict):
    """Traffic over time during a soak (a Locust LoadTestShape; harness/load/shapes.py)."""

    kind: Literal["steady", "ramp", "diurnal", "bursts", "replay"] = Field(
        "steady", description="how the stream count moves over the soak (docs/soak.md)"
    )
    users: int = Field(
        1,
        ge=1,
        le=100_000,
        description="steady: streams; ramp: final; diurnal: peak; bursts: base; replay: most in flight",
    )
    start_users: int = Field(1, ge=0, le=100_000, description="ramp: first; diurnal: trough")
    peak_users: int | None = Field(None, ge=1, le=100_000, description="bursts: streams during a burst")
    period_s: float | None = Field(
        None, gt=0, le=604_800, description="diurnal: one compressed day (default: the soak); bursts: burst spacing"
    )
    burst_s: float = Field(
        10.0, gt=0, le=86_400, description="bursts: the last burst_s of every period_s runs peak_users"
    )
    trace: str | None = Field(None, description='replay: JSONL file of {"t_s": offset} (optional prompt_id)')
    spawn_rate: float = Field(
        10.0, gt=0, le=10_000, description="streams Locust starts or stops per second when the shape changes its count"
    )

    @model_validator(mode="after")
    def _needs(self) -> Shape:
        if self.kind == "replay" and not self.trace:
            raise ValueError("shape 'replay' needs a 'trace' file")
        if self.kind == "bursts" and self.peak_users is None:
            raise ValueError("shape 'bursts' needs 'peak_users'")
        return self


class SoakArrival(_Strict):
    """Open-loop arrivals during a soak (harness/load/pacing.py): the rate over the soak is steady, a list of stages
    cycled over it, or a diurnal curve; each request goes out at its scheduled time whatever the answers before it,
    up to ``max_in_flight`` at once, and one that cannot go out on time is recorded late with its delay."""

    kind: ArrivalKind = Field(
        "poisson",
        description="gaps between arrivals: constant, poisson (exponential) or gamma (coefficient of variation cv), "
        "drawn at unit rate and stretched over the rate curve (time rescaling)",
    )
    rate_rps: float | None = Field(None, gt=0, le=100_000, description="steady: the rate; curve diurnal: the peak rate")
    curve: Literal["steady", "diurnal"] = Field(
        "steady",
        description="with rate_rps: steady (the same rate throughout) or diurnal (trough_rps at t=0, rate_rps half a period later)",
    )
    trough_rps: float | None = Field(
        None, gt=0, le=100_000, description="curve diurnal: the rate at 'midnight' (t=0 and every period_s)"
    )
    period_s: float | None = Field(
        None, gt=0, le=604_800, description="curve diurnal: one compressed day (default: the soak)"
    )
    stages: list[Stage] | None = Field(
        None,
        min_length=1,
        max_length=10_000,
        description="instead of rate_rps: rate × duration stages in order, started again from the first when they end before the soak does",
    )
    cv: float | None = Field(
        None, gt=0, le=100, description="gamma only (and required there): coefficient of variation of the gaps"
    )
    max_in_flight: int = Field(
        64,
        ge=1,
        le=65_536,
        description="requests in flight at most (over all Locust workers); a request due while this many are "
        "in flight waits for a slot and is recorded late with its send delay",
    )
    seed: int = Field(0, description="seed of the gaps: every configuration's soak gets the same schedule")

    @model_validator(mode="after")
    def _coherent(self) -> SoakArrival:
        if (self.rate_rps is None) == (self.stages is None):
            raise ValueError(
                "set exactly one of 'rate_rps' (steady or diurnal) or 'stages' (rate × duration, cycled over the soak)"
            )
        if self.kind == "gamma" and self.cv is None:
            raise ValueError(
                "kind 'gamma' needs 'cv', the coefficient of variation of the gaps (1 is as bursty as poisson)"
            )
        if self.kind != "gamma" and self.cv is not None:
            raise ValueError(
                f"'cv' is for kind 'gamma'; kind '{self.kind}' has a fixed one (constant 0, poisson 1): remove 'cv'"
            )
        if self.curve == "diurnal":
            if self.rate_rps is None or self.trough_rps is None:
                raise ValueError("curve 'diurnal' needs 'rate_rps' (the peak) and 'trough_rps'")
            if self.trough_rps > self.rate_rps:
                raise ValueError(f"trough_rps ({self.trough_rps:g}) is above the peak rate_rps ({self.rate_rps:g})")
        else:
            extra = [f for f in ("trough_rps", "period_s") if getattr(self, f) is not None]
            if extra:
                raise ValueError(
                    f"{' and '.join(extra)} {'is' if len(extra) == 1 else 'are'} for curve 'diurnal': set curve: diurnal or remove them"
                )
        if self.stages is not None and "curve" in self.model_fields_set:
            raise ValueError("'curve' is for rate_rps; stages set the rate themselves: remove 'curve'")
        return self

    def mean_rps(self, duration_s: float) -> float:
        """The mean rate the curve asks over a soak of ``duration_s``."""
        from harness.load.schedule import cumulative

        return cumulative(self.model_dump(), duration_s, duration_s) / duration_s if duration_s > 0 else 0.0


SOAK_MAX_REQUESTS = 50_000_000  # a soak's schedule is drawn in memory: more arrivals than this is a mistake in the rate


class Watchdog(_Strict):
    """What the soak watchdog calls a failure (docs/soak.md)."""

    probe_interval_s: float = Field(
        2.0, gt=0, le=600, description="how often the engine's process and health endpoint are checked (crash, hang)"
    )
    hang_s: float = Field(30.0, gt=0, le=86_400, description="engine unanswering this long: hang -> kill, restart")
    window_s: float = Field(60.0, gt=0, le=86_400, description="aggregation window for error rate and drift")
    error_rate: float = Field(0.2, gt=0, le=1, description="failed share of a window's requests that is a verdict")
    min_requests: int = Field(5, ge=1, description="a window with fewer requests is not judged")
    drift_alpha: float = Field(0.01, gt=0, lt=0.5, description="significance of the trend test")
    drift_min_change: float = Field(
        0.1, ge=0, le=10, description="relative change over the soak below which a trend is not a verdict"
    )
    drift_min_windows: int = Field(
        6, ge=3, le=10_000, description="windows (uncontaminated, with a value) before the trend test runs"
    )
    drift_min_span_s: float = Field(
        1800.0,
        ge=0,
        le=10_000_000,
        description="seconds between the first and last window the trend test takes before it runs: a shared VM's own "
        "speed moves ±15% over minutes, so a shorter trend is not the engine's (the change detector judges short soaks)",
    )
    max_restarts: int = Field(
        10,
        ge=0,
        le=10_000,
        description="engine restarts after crash or hang in one soak; one more and the soak gives up",
    )
    warmup_windows: int = Field(
        2,
        ge=0,
        le=10_000,
        description="windows after each engine start that the change detector neither judges nor learns from",
    )
    reference_windows: int = Field(
        5, ge=2, le=10_000, description="windows per load level that form the change detector's reference"
    )
    confirm_windows: int = Field(
        2, ge=1, le=100, description="consecutive windows past the change threshold that make a collapse"
    )
    memory_horizon_s: float = Field(
        3600.0,
        gt=0,
        le=7 * 86_400,
        description="a 'memory' verdict when available memory runs out sooner than this at the engine's slope",
    )
    memory_fit_s: float = Field(
        1800.0, gt=0, le=86_400, description="the recent span of engine memory the headroom forecast fits"
    )
    memory_limit_mib: float | None = Field(
        None,
        gt=0,
        le=2**30,
        description="memory the engine may hold at most (a container's limit), when lower than the machine's: "
        "the headroom forecast and the prompt-cache check count from it; default: the machine's available memory",
    )
    stall_warn_s: float = Field(
        5.0,
        gt=0,
        le=86_400,
        description="a 'stall' verdict when a stream's gap between two chunks or a "
        "health probe takes this long (again each time the longest pause grows by half)",
    )
    disk_min_free_mib: float = Field(
        1024.0,
        ge=0,
        le=16_777_216,
        description="a 'disk' verdict when the results disk has less free, or will have at its "
        "write rate within two windows (docs/soak.md#disk-space)",
    )
    overload_windows: int = Field(
        3,
        ge=2,
        le=10_000,
        description="open loop: consecutive windows at one rate whose backlog keeps growing that make an 'overload' "
        "verdict (a 'collapse' of served_rps when the engine served that rate earlier in the soak)",
    )
    actions: dict[VerdictKind, VerdictAction] = Field(
        default_factory=dict,
        description="what a verdict kind does: record, restart (crash, hang), stop_config, stop_run; defaults in docs/soak.md",
    )

    @field_validator("actions")
    @classmethod
    def _restartable(cls, v: dict[str, str]) -> dict[str, str]:
        for kind, action in v.items():
            if action == "restart" and kind not in ("crash", "hang"):
                raise ValueError(f"'{kind}: restart': only crash and hang can restart the engine")
            if kind in ("crash", "hang") and action == "record":
                raise ValueError(
                    f"'{kind}: record': a dead or hung engine cannot go on serving; use restart, stop_config or stop_run"
                )
        return v

    def action(self, kind: str) -> str:
        mine = self.actions.get(cast(VerdictKind, kind))  # a kind the scenario does not name is simply absent
        return mine if mine is not None else DEFAULT_ACTIONS.get(kind, "record")


class Canary(_Strict):
    """The output canary: fixed greedy prompts answered again and again through the soak (docs/soak.md#output-canary)."""

    enabled: bool | None = Field(
        None,
        description="default: on when the soak has a speculative configuration (every soaked configuration then answers: "
        "a baseline's answers are its speculative configurations' reference)",
    )
    every_s: float = Field(
        300.0,
        gt=0,
        le=86_400,
        description="seconds between canary rounds while the traffic runs (the first round is sent before it starts)",
    )
    max_tokens: int = Field(64, ge=1, le=4096, description="tokens per canary answer (greedy, no prompt cache)")
    seed: int = Field(0, description="seed of the canary requests")
    prompts: list[Annotated[str, StringConstraints(min_length=1)]] | None = Field(
        None,
        min_length=1,
        max_length=64,
        description="the canary's prompts (one user turn each); default: four built-in ones",
    )
    confirm_rounds: int | None = Field(
        None,
        ge=1,
        le=1000,
        description="a divergence: the same prompt differing from its reference in this many consecutive rounds; "
        "default: the engine's, from the measured floor",
    )
    max_differing: int | None = Field(
        None,
        ge=0,
        le=64,
        description="a divergence: more prompts than this differing from one reference in one round; default: the engine's",
    )


class RemoteWorkers(_Strict):
    """Locust workers on other hosts (docs/fleet.md#locust-workers-on-other-hosts): the master in the harness waits for
    ``count`` of them, each started there with ``specsoak worker --master BIND:PORT``."""

    count: int = Field(ge=1, le=256, description="workers the master waits for before each slice's load starts")
    bind: str = Field(description="address the Locust master binds, an IPv4 literal the workers' hosts reach")
    port: int = Field(5557, ge=1024, le=65535, description="the master's port, the same every slice")
    wait_s: float = Field(
        120.0,
        gt=0,
        le=3600,
        description="how long each slice's master waits for all its workers; then the slice fails as no_load",
    )

    @field_validator("bind")
    @classmethod
    def _ip(cls, v: str) -> str:
        return _ipv4("soak.remote_workers.bind", v)


class Soak(_Strict):
    duration_s: float = Field(gt=0, le=7 * 86_400, description="soak time per configuration")
    configurations: list[str] | None = Field(None, description="default: every configuration")
    slice_s: float | None = Field(
        None,
        gt=0,
        le=7 * 86_400,
        description="alternate configurations every slice, restarting each engine per slice "
        "(resets the state a late collapse needs); default: one engine for the whole soak",
    )
    shape: Shape = Field(default_factory=Shape, description="traffic over time: closed-loop streams (Locust users)")
    arrival: SoakArrival | None = Field(
        None,
        description="instead of shape: open-loop arrivals at a rate (steady, stages or diurnal), each request sent at its "
        "scheduled time and recorded late when it cannot be (docs/soak.md#open-loop-arrivals)",
    )
    workers: int = Field(0, ge=0, le=256, description="Locust workers (0: one local Locust process)")
    remote_workers: RemoteWorkers | None = Field(
        None,
        description="instead of workers: Locust workers on other hosts, started there with specsoak worker; their "
        "records, clock offsets and failures come back through the master (docs/fleet.md)",
    )
    prompts: str | None = Field(None, description="default: builtin:soak")
    max_tokens: int | None = Field(
        None, ge=1, le=131_072, description="tokens per answer; default: measurement.max_tokens"
    )
    stall_s: float = Field(60.0, gt=0, le=86_400, description="a request with no chunk this long fails as 'stall'")
    lengths: Lengths | None = Field(
        None, description="synthetic input/output lengths and a shared prefix for the soak's prompts"
    )
    prompt_reuse: PromptReuse = Field(
        "allow",
        description="forbid: no prompt is sent twice in a soak (Locust processes share the set out; a user whose share is "
        "used up stops, and the soak's records say so); allow: prompts wrap around",
    )
    watchdog: Watchdog = Field(default_factory=Watchdog, description="what counts as a failure, and what it does")
    canary: Canary = Field(
        default_factory=Canary, description="fixed greedy prompts answered through the soak, compared answer by answer"
    )
    after_repetitions: int = Field(
        3,
        ge=1,
        le=100,
        description="the measurement phases again on each soaked engine, this many times (each with the prompts and "
        "schedule of a repetition before it): the before/after comparison's interval, and a 'degraded' verdict when the "
        "soaked engine is slower beyond it (docs/soak.md#after-the-soak); 1 gives no interval",
    )

    @model_validator(mode="after")
    def _shape_or_arrival(self) -> Soak:
        if self.remote_workers is not None and self.workers:
            raise ValueError(
                "soak.workers (local Locust workers) and soak.remote_workers (workers on other hosts) are exclusive: "
                "remove one"
            )
        if self.arrival is not None:
            if "shape" in self.model_fields_set:
                raise ValueError(
                    "soak.shape (closed-loop users) and soak.arrival (open-loop arrivals) are exclusive: the soak's traffic is "
                    "one or the other; remove soak.shape or soak.arrival"
                )
            expected = self.arrival.mean_rps(self.duration_s) * self.duration_s
            if expected > SOAK_MAX_REQUESTS:
                raise ValueError(
                    f"soak.arrival asks about {expected:,.0f} requests over the soak (more than {SOAK_MAX_REQUESTS:,}): "
                    f"check rate_rps and duration_s"
                )
        return self

    def peak_streams(self) -> int:
        """The most requests the soak's load can have in flight at once (before the server's slots cap it)."""
        if self.arrival is not None:
            return self.arrival.max_in_flight
        sh = self.shape
        return max(sh.users, sh.start_users, sh.peak_users or 0)

    def load_kind(self) -> str:
        """What the soak's traffic is, in a word: the shape's kind, or 'open-loop <arrival kind>'."""
        return f"open-loop {self.arrival.kind}" if self.arrival is not None else self.shape.kind


class Ramp(_Strict):
    """Find max streams adaptively: double N from ``start`` while the SLO holds, then bisect (docs/reports.md)."""

    start: int = Field(1, ge=1, le=4096, description="the first stream count tried")
    max_streams: int = Field(64, ge=1, le=4096, description="the ramp stops here (the result is then a lower bound)")
    requests_per_stream: int = Field(2, ge=1, le=1000, description="requests each stream sends at each step")
    max_tokens: int | None = Field(None, ge=1, le=131_072, description="default: measurement.max_tokens")

    @model_validator(mode="after")
    def _order(self) -> Ramp:
        if self.start > self.max_streams:
            raise ValueError(f"start ({self.start}) is above max_streams ({self.max_streams})")
        return self


class Slo(_Strict):
    """What one stream must get for a stream count to count as served (the report's max streams), and what one
    request must get to count toward goodput (docs/metrics.md#goodput)."""

    per_stream_tps_min: float | None = Field(
        None,
        gt=0,
        description="median decode t/s of a request at N streams, at least; goodput: each request's decode t/s, at least",
    )
    ttft_p95_s_max: float | None = Field(
        None,
        gt=0,
        description="95th percentile TTFT at N streams, at most; goodput: each request's TTFT (from its scheduled time), at most",
    )
    e2e_s_max: float | None = Field(
        None, gt=0, description="goodput only: each request's end-to-end time (from its scheduled time), at most"
    )
    ramp: Ramp | None = Field(None, description="search max streams with a ramp after each configuration's measurement")


class ReportOptions(_Strict):
    memory_budget_mib: float | None = Field(
        None, gt=0, le=16_777_216, description="memory for weights + KV + buffers: the report's servable context"
    )
    engine_log_max_mib: float = Field(
        256.0,
        ge=0.0625,
        le=16_777_216,
        description="disk each engine log may take (per log file: start-up section whole, "
        "then the newest output in gzip segments; docs/soak.md#engine-logs)",
    )
    fill_check: bool = Field(
        False,
        description="restart each configuration at its servable context under the budget and fill every slot (needs memory_budget_mib)",
    )

    @model_validator(mode="after")
    def _budget(self) -> ReportOptions:
        if self.fill_check and self.memory_budget_mib is None:
            raise ValueError("fill_check needs memory_budget_mib: the servable context is computed from it")
        return self


class Scenario(_Strict):
    name: str = Field(pattern=NAME_PATTERN, description="names the run folder (results/<stamp>-<name>)")
    description: str = Field(
        "", description="free text for the reader (the scenario file is copied into the run folder)"
    )
    server: Server = Field(description="the engine and how to start it, shared by every configuration")
    configurations: list[Configuration] = Field(
        min_length=1, max_length=256, description="what to compare, in order; sweeps expand here"
    )
    measurement: Measurement = Field(default_factory=Measurement, description="the measured phases: the verdict table")
    soak: Soak | None = Field(None, description="hours of traffic per configuration after the phases (docs/soak.md)")
    slo: Slo | None = Field(None, description="what a stream must get for the report's max streams")
    report: ReportOptions = Field(default_factory=ReportOptions, description="memory budget and fill check")

    @model_validator(mode="after")
    def _remote_reach(self) -> Scenario:
        import ipaddress

        rw = self.soak.remote_workers if self.soak is not None else None
        srv = self.server
        if rw is None or srv.url is not None or srv.request_base_url is not None:
            return self
        host = ipaddress.ip_address(srv.host)
        if host.is_loopback or host.is_unspecified:
            raise ValueError(
                f"soak.remote_workers: the workers on other hosts send to the engine at server.host {srv.host}, which "
                f"they cannot reach; set server.host to an address they reach (or server.request_base_url)"
            )
        return self

    @model_validator(mode="after")
    def _soak_configs(self) -> Scenario:
        if self.soak and self.soak.configurations:
            names = {c.name for c in self.configurations} | {c.name for c in self.runs()}
            for n in self.soak.configurations:
                if n not in names:
                    raise ValueError(
                        f"soak.configurations: no configuration named '{n}'; configurations: {', '.join(sorted(names))}"
                    )
        return self

    @model_validator(mode="after")
    def _baselines(self) -> Scenario:
        """Every speculative configuration is compared with a baseline that serves its target model: named by
        ``baseline``, or found by model. A scenario without any baseline (a soak of one configuration) has no speedups."""
        runs = self.runs()
        bases = [c for c in runs if c.algorithm == "none"]
        names = {c.name: c for c in runs}
        for c in runs:
            if c.baseline is not None:
                base = names.get(c.baseline)
                if base is None or base.algorithm != "none":
                    raise ValueError(
                        f"configuration '{c.name}': baseline '{c.baseline}' is not a configuration with algorithm 'none'; "
                        f"baselines: {', '.join(b.name for b in bases) or 'none'}"
                    )
            elif (
                c.algorithm != "none"
                and bases
                and not any((b.model or self.server.model) == (c.model or self.server.model) for b in bases)
            ):
                raise ValueError(
                    f"configuration '{c.name}' targets {c.model or self.server.model}, which no baseline serves "
                    f"(baselines: {', '.join(f'{b.name} on {b.model or self.server.model}' for b in bases)}); add an "
                    f"'algorithm: none' configuration with that model, or name the one to compare with in 'baseline:'"
                )
        if self.measurement.verify is not None and not bases:
            raise ValueError("measurement.verify compares with a baseline: add a configuration with algorithm 'none'")
        return self

    @model_validator(mode="after")
    def _attached(self) -> Scenario:
        """Attach mode (server.url): one configuration (the server runs one), nothing that needs a launch."""
        if self.server.url is None:
            return self
        runs = self.runs()
        if len(runs) != 1:
            raise ValueError(
                f"server.url attaches to one running server, which runs one configuration; this scenario has "
                f"{len(runs)} ({', '.join(c.name for c in runs)}): one scenario per attached server"
            )
        if runs[0].engine_args or runs[0].is_synthetic:
            raise ValueError(
                f"configuration '{runs[0].name}': {'engine_args' if runs[0].engine_args else 'synthetic'} cannot apply to "
                f"an attached server (server.url): it is set where the server is launched"
            )
        if self.report.fill_check:
            raise ValueError(
                "report.fill_check restarts the engine at its servable context: not possible on an attached server (server.url)"
            )
        return self

    def baseline_of(self, cfg: Configuration) -> Configuration | None:
        """The configuration ``cfg``'s speedups are against (None: the scenario has no baseline for it)."""
        runs = self.runs()
        if cfg.baseline is not None:
            return next((c for c in runs if c.name == cfg.baseline), None)
        return next(
            (
                c
                for c in runs
                if c.algorithm == "none" and (c.model or self.server.model) == (cfg.model or self.server.model)
            ),
            None,
        )

    def runs(self) -> list[Configuration]:
        """The configurations to run, sweeps expanded (one per k and synthetic length)."""
        return [x for c in self.configurations for x in c.expand()]

    def soak_configurations(self) -> list[Configuration]:
        if not self.soak:
            return []
        wanted = self.soak.configurations
        return [c for c in self.runs() if wanted is None or c.name in wanted or c.sweep_of in wanted]

    @field_validator("configurations")
    @classmethod
    def _unique_names(cls, v: list[Configuration]) -> list[Configuration]:
        seen: set[str] = set()
        for c in v:
            for x in c.expand():
                if x.name in seen:
                    raise ValueError(
                        f"configuration name '{x.name}' is used twice"
                        + (f" (from the sweep of '{c.name}')" if x.sweep_of else "")
                    )
                seen.add(x.name)
        return v

    def baseline(self) -> Configuration | None:
        return next((c for c in self.runs() if c.algorithm == "none"), None)


def first_model(ann: Any) -> type[BaseModel] | None:
    """The first pydantic model in a field's annotation (``Soak | None`` -> Soak), or None."""
    if isinstance(ann, type) and issubclass(ann, BaseModel):
        return ann
    for arg in getattr(ann, "__args__", ()) or ():
        found = first_model(arg)
        if found is not None:
            return found
    return None


_SAFE = re.compile(r"[^A-Za-z0-9_.-]+")


def safe_name(name: str) -> str:
    return _SAFE.sub("_", name)
