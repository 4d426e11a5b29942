"""``specsoak verify``: do the speculative configurations change the model's output?

Greedy (temperature 0, fixed seed, no prompt cache): each non-synthetic speculative configuration
and the baseline answer the same prompts, at 1 stream and at N concurrent streams; every answer is
compared with the baseline's at 1 stream (and, at N, with the baseline's at N: batching alone may
change a greedy output). llama.cpp returns the generated token ids (``/completion`` with
``return_tokens``), so the comparison is token by token (``method: tokens``); other engines are
compared by text, and the first differing character's index stands in for the token index
(``method: text``, approximate).

With ``samples`` > 0 and a temperature above 0, each configuration also draws ``samples`` answers
to one prompt (a different seed each) and the first two generated tokens are compared with the
baseline's by a chi-square test of homogeneity (categories with an expected count below 5 pooled).

Results: ``verify.jsonl`` (one record per prompt, configuration and stream count) and
``verify_distribution.jsonl`` in the run folder; ``specsoak report`` shows them.
Synthetic configurations are recorded as skipped: their output is never valid model output.
"""

from __future__ import annotations

import time
from collections import Counter
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from rich.console import Console
from scipy import stats

from engines import engine_class
from engines.base import Engine
from harness import __version__
from harness.common.errors import EngineError, ScenarioError
from harness.common.net import free_port
from harness.config.loader import LoadedScenario
from harness.config.schema import Configuration, safe_name
from harness.load.greedy import Answer, GreedyClient
from harness.prompts import PromptError, load_prompts
from harness.records.files import MANIFEST, VERIFY, VERIFY_DIST, JsonlWriter, read_manifest, write_json_atomic
from harness.records.types import Manifest, VerifyState
from harness.run.manifest import machine_info, new_run_dir
from harness.session.engine import launch_spec
from harness.soak.canary import first_difference as token_difference


@dataclass
class VerifyOptions:
    streams: int | None = None  # default: the scenario's largest stream count
    prompts: int = 4
    max_tokens: int | None = None  # default: the scenario's max_tokens
    seed: int | None = None
    temperature: float = 0.8  # only for the distribution test
    samples: int = 0
    sample_tokens: int = 4
    configurations: list[str] = field(default_factory=list)  # default: all


def first_difference(ref: Answer, got: Answer) -> tuple[bool, int | None, str]:
    """(identical, first differing index, method): token ids when both have them, else characters."""
    return token_difference(ref.tokens, ref.text, got.tokens, got.text)


def chi_square(ref: Counter[Any], got: Counter[Any]) -> dict[str, Any]:
    """Chi-square test of homogeneity of two samples of categories; rare categories pooled."""
    n_ref, n_got = sum(ref.values()), sum(got.values())
    total = n_ref + n_got
    keep, other = [], [0, 0]
    for cat in sorted(set(ref) | set(got), key=str):
        a, b = ref.get(cat, 0), got.get(cat, 0)
        if min((a + b) * n_ref / total, (a + b) * n_got / total) < 5:
            other[0] += a
            other[1] += b
        else:
            keep.append([a, b])
    if sum(other):
        keep.append(other)
    if len(keep) < 2:
        return {"categories": len(keep), "statistic": None, "dof": 0, "p_value": None}
    res = stats.chi2_contingency(keep, correction=False)
    return {
        "categories": len(keep),
        "statistic": float(res.statistic),
        "dof": int(res.dof),
        "p_value": float(res.pvalue),
    }


def _failed(exc: EngineError) -> dict[str, Any]:
    """A speculative configuration's answers when its engine failed: the reason, no answers."""
    return {"error": f"{type(exc).__name__}: {exc}", "answers": {}, "samples": []}


class Verifier:
    def __init__(
        self,
        loaded: LoadedScenario,
        results_root: Path,
        opts: VerifyOptions,
        console: Console | None = None,
        into: Path | None = None,
    ):
        self.loaded = loaded
        self.sc = loaded.scenario
        self.opts = opts
        self.console = console or Console(stderr=True)
        self.results_root = results_root
        self.into = into
        m = self.sc.measurement
        try:
            prompts = load_prompts(m.prompts, loaded.path.parent)
        except PromptError as exc:
            raise ScenarioError(f"{loaded.path}: measurement.prompts: {exc}") from None
        self.prompts = prompts[: max(1, opts.prompts)]
        self.streams = opts.streams or max(m.streams)
        self.max_tokens = opts.max_tokens or m.max_tokens
        self.seed = m.seed if opts.seed is None else opts.seed
        self.engine_cls = engine_class(self.sc.server.engine)
        self.baseline = self.sc.baseline()
        if self.baseline is None:
            raise ScenarioError(f"{loaded.path}: verify needs a configuration with algorithm: none to compare with")
        wanted = set(opts.configurations)
        self.configs = [c for c in self.sc.configurations if c.speculative and (not wanted or c.name in wanted)]
        if wanted - {c.name for c in self.sc.configurations}:
            raise ScenarioError(
                f"--config: no configuration named {', '.join(sorted(wanted - {c.name for c in self.sc.configurations}))}"
            )

    def wants(self, cfg: Configuration) -> bool:
        """Whether the comparison needs ``cfg``'s answers: a speculative configuration it compares, or a baseline."""
        if cfg in self.configs:
            return not cfg.is_synthetic
        return cfg == self.baseline or any(self._base(c) == cfg for c in self.configs)

    def _base(self, cfg: Configuration) -> Configuration | None:
        """The baseline ``cfg`` is compared with: its own (``baseline:``, or by target model), else the scenario's."""
        return self.sc.baseline_of(cfg) or self.baseline

    def collect(self, engine: Engine, cfg: Configuration) -> dict[str, Any] | None:
        """``cfg``'s answers on an engine that is already up (a run's own, its phases measured); None for a baseline
        whose engine failed here (the comparison then starts one of its own)."""
        self.console.print(
            f"  {cfg.name}: greedy answers for verify ({len(self.prompts)} prompts, 1 and {self.streams} streams)"
        )
        try:
            return self.answers_on(engine, cfg)
        except EngineError as exc:
            self.console.print(f"  [red]{cfg.name}: verify answers: {type(exc).__name__}: {exc}[/]")
            return _failed(exc) if cfg.speculative else None

    def run(
        self, manifest: Manifest | None = None, collected: dict[str, dict[str, Any]] | None = None
    ) -> tuple[Path, bool]:
        """Run the comparison; returns (run folder, every non-synthetic configuration identical). In a run
        (``manifest``: the run's own, written by it and here), ``collected`` holds the answers its engines gave, by
        configuration; one missing (a resumed run) is asked of an engine started for it."""
        collected = collected or {}
        if self.into is not None:
            run_dir = self.into
            if manifest is None:
                manifest = read_manifest(run_dir)  # a run's manifest, with a "verify" key added
        else:
            run_dir = new_run_dir(self.results_root, f"verify-{self.sc.name}")
            (run_dir / "scenario.yaml").write_text(self.loaded.text, encoding="utf-8")
            (run_dir / "logs").mkdir()
            manifest = Manifest(
                run_id=run_dir.name,
                specsoak_version=__version__,
                kind="verify",
                scenario=self.sc.name,
                scenario_file=str(self.loaded.path),
                engine=self.sc.server.engine,
                engine_version=self.engine_cls.installed_version(),
                machine=machine_info(),
                started_unix=time.time(),
                status="running",
                scenario_parsed=self.sc.model_dump(mode="json"),
            )
        state = manifest.verify = VerifyState(
            started_unix=time.time(),
            streams=self.streams,
            prompts=[p.id for p in self.prompts],
            max_tokens=self.max_tokens,
            seed=self.seed,
            status="running",
        )
        write_json_atomic(run_dir / MANIFEST, manifest.to_dict())
        self.console.print(
            f"specsoak verify: {run_dir} ({len(self.prompts)} prompts, 1 and {self.streams} streams, {self.max_tokens} tokens)"
        )
        out = JsonlWriter(run_dir / VERIFY)
        dist = JsonlWriter(run_dir / VERIFY_DIST)
        all_same = True
        bases: dict[str, dict[str, Any]] = {}

        def base_of(cfg: Configuration) -> tuple[Configuration, dict[str, Any]]:
            """Each configuration is compared with its own baseline (``baseline:``, else the baseline of its target
            model: an MTP target has its own), whose engine starts once, the first time one needs it."""
            b = self._base(cfg)
            assert b is not None
            if b.name not in bases:
                bases[b.name] = collected.get(b.name) or self._answers(b, run_dir)
                answers = bases[b.name]["answers"]
                self._compare(out, b, self.streams, answers[self.streams], answers[1], f"{b.name}@1")
            return b, bases[b.name]

        try:
            assert self.baseline is not None
            base_of(self.baseline)
            for cfg in self.configs:
                b, base = base_of(cfg)
                ref1 = base["answers"][1]
                if cfg.is_synthetic:
                    for pr in self.prompts:
                        out.write(
                            self._row(
                                cfg,
                                1,
                                f"{b.name}@1",
                                pr.id,
                                None,
                                None,
                                "skipped",
                                None,
                                None,
                                note="synthetic acceptance: output is not valid model output",
                            )
                        )
                    self.console.print(f"  {cfg.name}: synthetic, skipped (never counted as lossless)")
                    continue
                got = collected.get(cfg.name) or self._answers(cfg, run_dir)
                if "error" in got:
                    all_same = False
                    for pr in self.prompts:
                        out.write(
                            self._row(cfg, 1, f"{b.name}@1", pr.id, None, None, "none", None, None, note=got["error"])
                        )
                    continue
                for n in sorted({1, self.streams}):
                    same = self._compare(out, cfg, n, got["answers"][n], ref1, f"{b.name}@1")
                    all_same = all_same and same
                if self.streams != 1:
                    self._compare(
                        out,
                        cfg,
                        self.streams,
                        got["answers"][self.streams],
                        base["answers"][self.streams],
                        f"{b.name}@{self.streams}",
                    )
                if self.opts.samples > 0:
                    dist.write(self._distribution(cfg, base["samples"], got["samples"]))
            state.status, state.stopped_unix, state.all_identical = "completed", time.time(), all_same
            if manifest.kind == "verify":
                manifest.status, manifest.stopped_unix, manifest.stop_reason = "completed", time.time(), "verified"
        except BaseException as exc:
            why = f"{type(exc).__name__}: {exc}"
            state.status, state.stopped_unix, state.reason = "failed", time.time(), why
            if manifest.kind == "verify":
                manifest.status, manifest.stopped_unix, manifest.stop_reason = "failed", time.time(), why
            raise
        finally:
            out.close()
            dist.close()
            write_json_atomic(run_dir / MANIFEST, manifest.to_dict())
        return run_dir, all_same

    # ---- one configuration -------------------------------------------------------------------
    def _answers(self, cfg: Configuration, run_dir: Path) -> dict[str, Any]:
        spec = launch_spec(self.loaded, cfg, free_port())
        engine = self.engine_cls(spec, run_dir / "logs" / f"verify-{safe_name(cfg.name)}.server.log")
        self.console.print(f"  {cfg.name} ({cfg.algorithm}): starting {self.engine_cls.name}")
        try:
            engine.start()
            engine.wait_ready(self.sc.server.start_timeout_s)
            engine.check_speculation()
            return self.answers_on(engine, cfg)
        except EngineError as exc:
            self.console.print(f"  [red]{cfg.name}: {type(exc).__name__}: {exc}[/]")
            if not cfg.speculative:
                raise
            return _failed(exc)
        finally:
            engine.stop(self.sc.server.stop_grace_s)

    def answers_on(self, engine: Engine, cfg: Configuration) -> dict[str, Any]:
        """The greedy answers of a ready engine: every prompt at 1 stream, then at ``streams`` concurrent ones (and
        the samples of the distribution test)."""
        client = GreedyClient(engine)
        timeout = self.sc.server.request_timeout_s
        answers: dict[int, list[Answer]] = {
            1: [client.answer(p, self.max_tokens, 0.0, self.seed, timeout) for p in self.prompts]
        }
        if self.streams != 1:
            jobs = [
                (p, f"{p.id}" if i < len(self.prompts) else f"{p.id}#{i // len(self.prompts)}")
                for i, p in enumerate(self.prompts * -(-self.streams // len(self.prompts)))
            ]
            with ThreadPoolExecutor(max_workers=self.streams) as pool:
                answers[self.streams] = list(
                    pool.map(lambda j: client.answer(j[0], self.max_tokens, 0.0, self.seed, timeout, j[1]), jobs)
                )
        samples: list[Answer] = []
        if self.opts.samples > 0:
            offset = 0 if not cfg.speculative else 1_000_003  # the two samples must be independent draws
            samples = [
                client.answer(
                    self.prompts[0], self.opts.sample_tokens, self.opts.temperature, self.seed + offset + i, timeout
                )
                for i in range(self.opts.samples)
            ]
        return {"answers": answers, "samples": samples}

    def _compare(
        self, out: JsonlWriter, cfg: Configuration, n: int, got: list[Answer], ref: list[Answer], ref_name: str
    ) -> bool:
        by_id = {a.prompt_id: a for a in ref}
        same_all = True
        diverged = errors = 0
        for a in got:
            r = by_id.get(a.prompt_id.split("#")[0])
            if r is None or r.error or a.error:
                note = a.error or (r.error if r else "no reference")
                out.write(self._row(cfg, n, ref_name, a.prompt_id, None, None, "none", a, r, note=note))
                same_all = False
                errors += 1
                if errors == 1:
                    self.console.print(f"  [red]{cfg.name} @{n}: no comparison for {a.prompt_id}: {note}[/]")
                continue
            same, idx, method = first_difference(r, a)
            diverged += not same
            same_all = same_all and same
            out.write(self._row(cfg, n, ref_name, a.prompt_id, same, idx, method, a, r))
        self.console.print(
            f"  {cfg.name} @{n} vs {ref_name}: {len(got) - diverged - errors}/{len(got)} identical"
            + (f", {errors} without an answer to compare" if errors else "")
        )
        return same_all

    def _row(
        self,
        cfg: Configuration,
        n: int,
        ref_name: str,
        pid: str,
        same: bool | None,
        idx: int | None,
        method: str,
        got: Answer | None,
        ref: Answer | None,
        note: str | None = None,
    ) -> dict[str, Any]:
        row: dict[str, Any] = {
            "config": cfg.name,
            "algorithm": cfg.algorithm,
            "synthetic": cfg.is_synthetic,
            "k": cfg.k,
            "streams": n,
            "reference": ref_name,
            "prompt_id": pid,
            "method": method,
            "identical": same,
            "first_diff_token": idx,
            "temperature": 0.0,
            "seed": self.seed,
            "max_tokens": self.max_tokens,
            "note": note,
        }
        if got is not None:
            row.update(
                draft_tokens=got.draft_tokens,
                accepted_tokens=got.accepted_tokens,
                out_tokens=len(got.tokens) if got.tokens is not None else None,
                out_text=got.text,
            )
        if ref is not None:
            row.update(ref_tokens=len(ref.tokens) if ref.tokens is not None else None)
        if same is False and idx is not None and got is not None and ref is not None:
            if method == "tokens" and got.tokens is not None and ref.tokens is not None:
                row.update(
                    ref_token_id=ref.tokens[idx] if idx < len(ref.tokens) else None,
                    out_token_id=got.tokens[idx] if idx < len(got.tokens) else None,
                )
            row.update(ref_text=ref.text)
        return row

    def _distribution(self, cfg: Configuration, base: list[Answer], got: list[Answer]) -> dict[str, Any]:
        def cats(answers: list[Answer]) -> Counter[str]:
            c: Counter[str] = Counter()
            for a in answers:
                if a.error:
                    continue
                c[",".join(str(t) for t in a.tokens[:2]) if a.tokens is not None else a.text[:8]] += 1
            return c

        ref_c, got_c = cats(base), cats(got)
        res = chi_square(ref_c, got_c)
        p = res["p_value"]
        verdict = (
            "no test: all samples in one category"
            if p is None
            else f"distributions differ (p = {p:.3g} < 0.01)"
            if p < 0.01
            else f"no difference detected (p = {p:.3g})"
        )
        return {
            "config": cfg.name,
            "algorithm": cfg.algorithm,
            "synthetic": cfg.is_synthetic,
            "temperature": self.opts.temperature,
            "samples": min(sum(ref_c.values()), sum(got_c.values())),
            "samples_baseline": sum(ref_c.values()),
            "samples_config": sum(got_c.values()),
            "what": "first two generated tokens",
            "prompt_id": self.prompts[0].id,
            **res,
            "verdict": verdict,
            "counts": {"baseline": dict(ref_c.most_common(20)), "config": dict(got_c.most_common(20))},
        }
