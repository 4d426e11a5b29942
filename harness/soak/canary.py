"""The output canary: a few fixed greedy prompts, answered again and again through a configuration's soak.

Speculative decoding is lossless only while the engine is correct. Every ``every_s`` of a soak the
canary sends the same prompts (temperature 0, fixed ``max_tokens`` and seed, no prompt cache), one at a
time among the traffic, and compares each answer with that configuration's first answer to the same
prompt and, where the scenario has a baseline for the same target whose soak has answered, with the
baseline's first answer. Token ids where the engine returns them (llama.cpp ``/completion`` with
``return_tokens``; vLLM ``return_token_ids``), text otherwise, exactly as ``specsoak verify`` compares.

Records go to ``canary.jsonl`` (one per answer, apart from the traffic windows): time, engine uptime,
round, prompt, token ids and text, and the first differing position against each reference. A
refused or failed canary request is a record with ``status: "error"``, never an exception.

The rule (docs/soak.md#output-canary): greedy answers of an unchanged engine under concurrent load may
flip where two tokens are nearly tied, because the batch changes the order of floating-point sums; such a
flip depends on the batch the answer met, so it need not come back at the next round. A divergence is therefore an answer that differs from
its reference in ``confirm_rounds`` consecutive rounds (the same prompt), or a round in which more than
``max_differing`` of the prompts differ at once; the defaults come from the floor measured per engine
and dtype (``python -m bench.canary_floor``).
"""

from __future__ import annotations

import threading
import time
from collections.abc import Callable, Iterable, Sequence
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import TYPE_CHECKING, Any

from harness.load.greedy import GreedyClient
from harness.prompts import Prompt
from harness.records.files import JsonlWriter, read_jsonl
from harness.records.types import CanaryRound

if TYPE_CHECKING:
    from engines.base import Engine
    from harness.config.schema import Configuration, Scenario
    from harness.session.engine import EngineSession, RunContext

CANARY = "canary.jsonl"

# fixed prompts whose greedy answers are long and deterministic enough to show a wrong token
BUILTIN_PROMPTS: tuple[tuple[str, str], ...] = (
    ("count", "Count from 1 to 40 in words, separated by commas."),
    ("capital", "What is the capital of France? Describe the city in five sentences."),
    ("code", "Write a Python function that returns the n-th Fibonacci number, with a docstring and a short example."),
    ("recipe", "Give a recipe for pancakes: the ingredients as a list, then the steps, numbered."),
)


def canary_prompts(texts: Sequence[str] | None) -> list[Prompt]:
    """The canary's prompts: the scenario's (ids ``canary-<n>``) or the built-in ones."""
    if texts:
        return [Prompt(f"canary-{i}", [{"role": "user", "content": t}]) for i, t in enumerate(texts)]
    return [Prompt(f"canary-{pid}", [{"role": "user", "content": t}]) for pid, t in BUILTIN_PROMPTS]


@dataclass(frozen=True)
class Difference:
    """One answer against one reference."""

    identical: bool
    first_diff: int | None  # the first differing token (method tokens) or character (method text); None when identical
    method: str  # "tokens" or "text"
    reference: str  # "first" or the baseline configuration's name

    def to_dict(self) -> dict[str, Any]:
        return asdict(self)


def first_difference(
    ref_tokens: Sequence[int] | None, ref_text: str, tokens: Sequence[int] | None, text: str
) -> tuple[bool, int | None, str]:
    """(identical, first differing index, method): token ids when both answers have them, else characters.
    An answer that is a prefix of the other differs where the shorter one ends."""
    a: Sequence[Any]
    b: Sequence[Any]
    a, b, method = (
        (ref_tokens, tokens, "tokens") if ref_tokens is not None and tokens is not None else (ref_text, text, "text")
    )
    for i, (x, y) in enumerate(zip(a, b, strict=False)):
        if x != y:
            return False, i, method
    same = len(a) == len(b)
    return same, None if same else min(len(a), len(b)), method


@dataclass(frozen=True)
class CanaryAnswer:
    """One canary answer as recorded (a line of canary.jsonl)."""

    t_unix: float
    config: str
    slice: str
    round: int
    prompt_id: str
    status: str  # "ok" or "error"
    text: str = ""
    tokens: tuple[int, ...] | None = None
    error: str | None = None
    elapsed_s: float | None = None
    engine_pid: int | None = None
    engine_uptime_s: float | None = None
    draft_tokens: int | None = None
    accepted_tokens: int | None = None
    vs_first: Difference | None = None
    vs_baseline: Difference | None = None

    def to_dict(self) -> dict[str, Any]:
        d = asdict(self)
        d["tokens"] = list(self.tokens) if self.tokens is not None else None
        return d

    @classmethod
    def from_dict(cls, d: dict[str, Any]) -> CanaryAnswer:
        def diff(x: Any) -> Difference | None:
            return (
                Difference(bool(x["identical"]), x.get("first_diff"), str(x["method"]), str(x["reference"]))
                if isinstance(x, dict)
                else None
            )

        toks = d.get("tokens")
        return cls(
            float(d["t_unix"]),
            str(d["config"]),
            str(d.get("slice") or ""),
            int(d.get("round") or 0),
            str(d["prompt_id"]),
            str(d.get("status") or "error"),
            str(d.get("text") or ""),
            tuple(int(t) for t in toks) if isinstance(toks, list) else None,
            d.get("error"),
            d.get("elapsed_s"),
            d.get("engine_pid"),
            d.get("engine_uptime_s"),
            d.get("draft_tokens"),
            d.get("accepted_tokens"),
            diff(d.get("vs_first")),
            diff(d.get("vs_baseline")),
        )


Pick = Callable[[CanaryAnswer], Difference | None]  # which comparison of an answer to read


def first_answers(records: Iterable[dict[str, Any]], config: str) -> dict[str, CanaryAnswer]:
    """Each prompt's first successful answer of ``config``: its reference for the whole soak, resumes included."""
    out: dict[str, CanaryAnswer] = {}
    for r in records:
        if r.get("config") == config and r.get("status") == "ok" and str(r.get("prompt_id")) not in out:
            out[str(r["prompt_id"])] = CanaryAnswer.from_dict(r)
    return out


# ---- the rule -------------------------------------------------------------------------------------------


@dataclass(frozen=True)
class Rule:
    """When differing answers are a divergence (docs/soak.md#output-canary)."""

    confirm_rounds: int = 3  # the same prompt differing from the same reference in this many consecutive rounds
    max_differing: int = 1  # more prompts than this differing from one reference in one round
    # True: every answer must equal the baseline's. False: only a prompt whose first answer equalled the baseline's
    # counts against it (where speculation changes the numerics, e.g. bfloat16, some answers differ from the start)
    baseline_strict: bool = False


# per engine, from its measured floor (bench/canary_floor.py, figures in docs/soak.md#output-canary): llama.cpp's answers
# match the baseline's exactly, so the baseline is strict; vLLM's bfloat16 speculation changes some from the start.
# A difference must repeat once either way; an engine without a measured floor gets three rounds.
DEFAULT_RULES: dict[str, Rule] = {
    "llamacpp": Rule(confirm_rounds=2, max_differing=1, baseline_strict=True),
    "vllm": Rule(confirm_rounds=2, max_differing=1, baseline_strict=False),
}


def _agreed_at_first(first: CanaryAnswer | None) -> bool:
    """Whether a prompt's first answer equalled the baseline's (True when there was nothing to compare it with)."""
    return first is None or first.vs_baseline is None or first.vs_baseline.identical


def default_rule(engine: str) -> Rule:
    return DEFAULT_RULES.get(engine, Rule())


@dataclass
class Divergence:
    """Why a round is a divergence, and its evidence."""

    reference: str  # "first" or the baseline's name
    why: str
    prompt_id: str
    first_diff: int | None
    method: str
    text: str
    ref_text: str
    ref_round: int
    rounds: int  # consecutive rounds this prompt has differed
    differing: list[str] = field(default_factory=list)  # every prompt differing in this round

    def evidence(self) -> dict[str, Any]:
        return asdict(self)


@dataclass
class Judge:
    """Counts, per reference and prompt, the consecutive rounds an answer differed, and says when that is a divergence."""

    rule: Rule
    streak: dict[tuple[str, str], int] = field(default_factory=dict)

    def replay(self, records: Iterable[dict[str, Any]], config: str) -> None:
        """The streaks as they stood after these records (resume)."""
        mine = [r for r in records if r.get("config") == config]
        firsts = first_answers(mine, config)
        rounds: dict[tuple[str, int], list[CanaryAnswer]] = {}
        for r in mine:
            a = CanaryAnswer.from_dict(r)
            rounds.setdefault((a.slice, a.round), []).append(a)
        for key in sorted(rounds, key=lambda k: min(a.t_unix for a in rounds[k])):
            self.judge(rounds[key], firsts, {})

    def judge(
        self, answers: Sequence[CanaryAnswer], firsts: dict[str, CanaryAnswer], baseline: dict[str, CanaryAnswer]
    ) -> Divergence | None:
        """One round's answers: update the streaks and return the first divergence the rule calls (None: none)."""
        found: Divergence | None = None
        against: tuple[tuple[str, dict[str, CanaryAnswer], Pick], ...] = (
            ("first", firsts, lambda a: a.vs_first),
            ("baseline", baseline, lambda a: a.vs_baseline),
        )
        for ref_name, refs, pick in against:
            differing = []
            for a in answers:
                d: Difference | None = pick(a)
                if a.status != "ok" or d is None:
                    continue  # an error or no reference yet: the streak stands, neither broken nor lengthened
                if (
                    ref_name == "baseline"
                    and not self.rule.baseline_strict
                    and not _agreed_at_first(firsts.get(a.prompt_id))
                ):
                    continue  # it differed from the baseline from the start: the first answers are its reference
                key = (d.reference if ref_name == "baseline" else "first", a.prompt_id)
                if d.identical:
                    self.streak.pop(key, None)
                else:
                    self.streak[key] = self.streak.get(key, 0) + 1
                    differing.append((a, d))
            if found is not None or not differing:
                continue
            too_many = len(differing) > self.rule.max_differing
            worst = max(
                differing,
                key=lambda x: self.streak[(x[1].reference if ref_name == "baseline" else "first", x[0].prompt_id)],
            )
            a, d = worst
            n = self.streak[(d.reference if ref_name == "baseline" else "first", a.prompt_id)]
            if not too_many and n < self.rule.confirm_rounds:
                continue
            ref = refs.get(a.prompt_id)
            one, many = (
                ("its first answer", "their first answers")
                if ref_name == "first"
                else (f"the baseline {d.reference}'s answer", f"the baseline {d.reference}'s answers")
            )
            why = (
                f"{len(differing)} of {len(answers)} canary answers differ from {many} in one round (at most {self.rule.max_differing} allowed)"
                if too_many
                else f"{a.prompt_id} differs from {one} in {n} consecutive rounds"
            )
            found = Divergence(
                d.reference,
                why,
                a.prompt_id,
                d.first_diff,
                d.method,
                a.text,
                ref.text if ref else "",
                ref.round if ref else 0,
                n,
                [x[0].prompt_id for x in differing],
            )
        return found


# ---- asking -----------------------------------------------------------------------------------------------

Asker = Callable[[Prompt], Any]  # returns a harness.load.greedy.Answer


def answer_asker(engine: Engine, max_tokens: int, seed: int, timeout_s: float) -> Asker:
    """Greedy answers from ``engine`` through its request URL (a proxy in between sees them), as ``specsoak verify`` asks."""
    client = GreedyClient(engine, url=engine.request_url)
    return lambda p: client.answer(p, max_tokens, 0.0, seed, timeout_s)


def compare(
    got: CanaryAnswer, firsts: dict[str, CanaryAnswer], baseline: dict[str, CanaryAnswer], baseline_name: str | None
) -> CanaryAnswer:
    """``got`` with its differences from its first answer and the baseline's (None where there is no reference)."""
    if got.status != "ok":
        return got
    vs_first = vs_base = None
    ref = firsts.get(got.prompt_id)
    if ref is not None and (ref.slice, ref.round) != (got.slice, got.round):
        same, idx, method = first_difference(ref.tokens, ref.text, got.tokens, got.text)
        vs_first = Difference(same, idx, method, "first")
    base = baseline.get(got.prompt_id)
    if base is not None and baseline_name is not None:
        same, idx, method = first_difference(base.tokens, base.text, got.tokens, got.text)
        vs_base = Difference(same, idx, method, baseline_name)
    return CanaryAnswer(**{**got.__dict__, "vs_first": vs_first, "vs_baseline": vs_base})


class Canary:
    """The canary of one configuration's soak slice: rounds in a background thread, judged in the caller's thread.

    ``poll(now)`` starts a round when one is due and returns the divergence of a round that has finished (None:
    nothing to say). The first round of a slice is ``first_round()``, synchronous, before the traffic starts."""

    def __init__(
        self,
        run_dir: Path,
        config: str,
        slice_id: str,
        prompts: Sequence[Prompt],
        ask: Asker,
        every_s: float,
        rule: Rule,
        baseline: str | None,
        engine_info: Callable[[], tuple[int | None, float | None]],
    ):
        self.run_dir = run_dir
        self.config = config
        self.slice_id = slice_id
        self.prompts = list(prompts)
        self.ask = ask
        self.every_s = every_s
        self.baseline_name = baseline
        self.engine_info = engine_info  # () -> (engine pid, engine uptime s)
        recorded = list(read_jsonl(run_dir / CANARY))
        self.firsts = first_answers(recorded, config)
        self.baseline = first_answers(recorded, baseline) if baseline is not None else {}
        self.judge = Judge(rule)
        self.judge.replay(recorded, config)
        self.round = max(
            (int(r.get("round") or 0) for r in recorded if r.get("config") == config and r.get("slice") == slice_id),
            default=0,
        )
        self.writer = JsonlWriter(run_dir / CANARY)
        self.next_due = 0.0  # monotonic
        self._thread: threading.Thread | None = None
        self._done: list[CanaryAnswer] | None = None
        self.rounds_done = 0
        self.errors = 0
        self.last: Divergence | None = None
        self.answers: list[CanaryAnswer] = []  # the last round, judged

    def _round(self) -> list[CanaryAnswer]:
        self.round += 1
        out = []
        for p in self.prompts:
            t0 = time.perf_counter()
            ans = self.ask(p)
            elapsed = time.perf_counter() - t0
            pid, up = self.engine_info()
            out.append(
                CanaryAnswer(
                    time.time(),
                    self.config,
                    self.slice_id,
                    self.round,
                    p.id,
                    "error" if ans.error else "ok",
                    ans.text,
                    ans.tokens,
                    ans.error,
                    round(elapsed, 4),
                    pid,
                    up,
                    ans.draft_tokens,
                    ans.accepted_tokens,
                )
            )
        return out

    def _finish(self, answers: list[CanaryAnswer]) -> Divergence | None:
        """Compare, record and judge one round (the caller's thread)."""
        judged = []
        for a in answers:
            first = a.status == "ok" and a.prompt_id not in self.firsts
            if first:
                self.firsts[a.prompt_id] = a
            c = compare(a, self.firsts, self.baseline, self.baseline_name)
            if first:
                self.firsts[a.prompt_id] = (
                    c  # the first answer to this prompt is its reference, with how it compared with the baseline
                )
            judged.append(c)
        for a in judged:
            self.writer.write(a.to_dict())
        self.rounds_done += 1
        self.errors += sum(a.status != "ok" for a in judged)
        div = self.judge.judge(judged, self.firsts, self.baseline)
        if div is not None:
            self.last = div
        self.answers = judged
        return div

    def first_round(self) -> Divergence | None:
        div = self._finish(self._round())
        self.next_due = time.monotonic() + self.every_s
        return div

    def _run(self) -> None:
        self._done = self._round()

    def poll(self, now_mono: float | None = None) -> tuple[bool, Divergence | None]:
        """(a round finished, its divergence); starts the next round when it is due."""
        now_mono = time.monotonic() if now_mono is None else now_mono
        if self._thread is not None and not self._thread.is_alive():
            self._thread = None
            done, self._done = self._done or [], None
            return True, self._finish(done)
        if self._thread is None and now_mono >= self.next_due:
            self.next_due = now_mono + self.every_s
            self._thread = threading.Thread(target=self._run, name=f"canary-{self.slice_id}", daemon=True)
            self._thread.start()
        return False, None

    def summary(self) -> CanaryRound:
        """The last round in figures (the exporter's gauges): answers, errors, and how many differ from each reference
        (None: no reference yet)."""
        rows = round_summaries([a.to_dict() for a in self.answers])
        s = rows[-1] if rows else CanaryRound(self.config, self.slice_id, self.round, time.time())
        s.baseline, s.diverged = self.baseline_name, self.last is not None
        return s

    def close(self, wait_s: float = 0.0) -> None:
        """Stop: a round in flight is given ``wait_s`` to finish and is recorded if it does."""
        if self._thread is not None:
            self._thread.join(wait_s)
            if not self._thread.is_alive():
                self.poll()
        self.writer.close()


# ---- the soak's side ----------------------------------------------------------------------------------------


def canary_enabled(sc: Scenario) -> bool:
    """Whether the scenario's soak runs the canary: as set, else when it soaks a speculative configuration."""
    if sc.soak is None:
        return False
    on = sc.soak.canary.enabled
    return bool(on) if on is not None else any(c.speculative for c in sc.soak_configurations())


def rule_of(sc: Scenario, engine: str) -> Rule:
    """The engine's default rule, with the scenario's ``confirm_rounds`` / ``max_differing`` where it sets them."""
    assert sc.soak is not None
    base, c = default_rule(engine), sc.soak.canary
    return Rule(
        c.confirm_rounds if c.confirm_rounds is not None else base.confirm_rounds,
        c.max_differing if c.max_differing is not None else base.max_differing,
        base.baseline_strict,
    )


def for_slice(ctx: RunContext, cfg: Configuration, session: EngineSession, slice_id: str) -> Canary | None:
    """The canary of one soak slice (None: off, or a synthetic configuration, whose output is not the model's)."""
    sc = ctx.sc
    if not canary_enabled(sc) or cfg.is_synthetic or sc.soak is None:
        return None
    c = sc.soak.canary
    soaked = {x.name for x in sc.soak_configurations()}
    base = sc.baseline_of(cfg) if cfg.speculative else None
    baseline = base.name if base is not None and base.name in soaked else None
    timeout = sc.server.request_timeout_s

    def ask(p: Prompt) -> Any:
        return answer_asker(session.engine, c.max_tokens, c.seed, timeout)(p)  # the engine of the moment (restarts)

    return Canary(
        ctx.run_dir,
        cfg.name,
        slice_id,
        canary_prompts(c.prompts),
        ask,
        c.every_s,
        rule_of(sc, sc.server.engine),
        baseline,
        lambda: (session.pid, session.uptime_s()),
    )


def _differing(ans: Sequence[CanaryAnswer], pick: Pick) -> int | None:
    """How many of a round's answered prompts differ from a reference (``pick``), or None when none was compared."""
    diffs = [d for a in ans if a.status == "ok" and (d := pick(a)) is not None]
    return sum(not d.identical for d in diffs) if diffs else None


def round_summaries(records: Iterable[dict[str, Any]], verdicts: Iterable[dict[str, Any]] = ()) -> list[CanaryRound]:
    """Each recorded round as ``Canary.summary`` gave it (a run folder replayed: ``specsoak export``); ``diverged`` once a
    divergence verdict of the configuration precedes the round's end."""
    rounds: dict[tuple[str, str, int], list[CanaryAnswer]] = {}
    for r in records:
        a = CanaryAnswer.from_dict(r)
        rounds.setdefault((a.config, a.slice, a.round), []).append(a)
    div_t: dict[str, float] = {}
    for v in verdicts:
        if v.get("kind") == "divergence" and v.get("config") is not None:
            div_t[str(v["config"])] = min(div_t.get(str(v["config"]), float("inf")), float(v.get("t_unix") or 0.0))
    out = []
    for (config, slice_id, rnd), ans in rounds.items():
        t = max(a.t_unix for a in ans)

        base = next((a.vs_baseline.reference for a in ans if a.vs_baseline is not None), None)
        out.append(
            CanaryRound(
                config,
                slice_id,
                rnd,
                t,
                answers=len(ans),
                errors=sum(a.status != "ok" for a in ans),
                differing_first=_differing(ans, lambda a: a.vs_first),
                differing_baseline=_differing(ans, lambda a: a.vs_baseline),
                baseline=base,
                diverged=div_t.get(config, float("inf")) <= t + 1.0,
                error=next((a.error for a in ans if a.error), None),
            )
        )
    return sorted(out, key=lambda s: s.t_unix)


def canary_cell(records: Sequence[dict[str, Any]], verdicts: Sequence[dict[str, Any]], config: str) -> str:
    """The soak table's canary column for one configuration: rounds, differing answers against each reference, the
    divergence verdict with its prompt and position, and refused answers ("off" when it sent none)."""
    mine = [CanaryAnswer.from_dict(r) for r in records if r.get("config") == config]
    if not mine:
        return "off"
    rounds = len({(a.slice, a.round) for a in mine})
    ok = [a for a in mine if a.status == "ok"]
    errors = len(mine) - len(ok)
    parts = []
    div = next((v for v in verdicts if v.get("config") == config and v.get("kind") == "divergence"), None)
    if div is not None:
        ev = div.get("evidence") or {}
        unit = "token" if ev.get("method") == "tokens" else "character"
        ref = "its first answer" if ev.get("reference") == "first" else f"baseline {ev.get('reference')}"
        up = div.get("engine_uptime_s")
        parts.append(
            f"✗ divergence: {ev.get('prompt_id')} vs {ref} at {unit} {ev.get('first_diff')}"
            + (f", engine uptime {float(up) / 3600:.2f} h" if up is not None else "")
        )
    else:
        parts.append("✓" if ok else "✗ no answer")
    picks: tuple[tuple[str, Pick], ...] = (("first", lambda a: a.vs_first), ("baseline", lambda a: a.vs_baseline))
    for label, pick in picks:
        diffs = [d for a in ok if (d := pick(a)) is not None]
        if diffs:
            parts.append(
                f"{sum(not d.identical for d in diffs)}/{len(diffs)} differ from {'first answers' if label == 'first' else diffs[0].reference}"
            )
    parts.append(f"{rounds} round{'s' if rounds != 1 else ''}")
    if errors:
        first_err = next(a.error for a in mine if a.status != "ok")
        parts.append(f"{errors}/{len(mine)} refused or failed ({first_err})")
    return ", ".join(parts)
