"""The output canary (harness/soak/canary.py): comparison, the floor rule, scheduling, records, resume, report and gauges."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pytest

from harness.config.policy import DEFAULT_ACTIONS, verdict_fails
from harness.config.schema import Scenario
from harness.load.greedy import Answer
from harness.metrics.exporter import MetricsExporter
from harness.prompts import Prompt
from harness.records.files import read_jsonl
from harness.records.types import CanaryRound
from harness.soak.canary import (
    CANARY,
    Canary,
    CanaryAnswer,
    Difference,
    Judge,
    Rule,
    canary_cell,
    canary_enabled,
    canary_prompts,
    compare,
    first_answers,
    first_difference,
    round_summaries,
    rule_of,
)

REF = (10, 11, 12, 13, 14)


# ---- comparison ---------------------------------------------------------------------------------------------
_TWO_ROUNDS = Rule(confirm_rounds=2)


def test_first_difference_by_token_ids_when_both_have_them() -> None:
    assert first_difference(REF, "abc", REF, "xyz") == (True, None, "tokens")  # ids equal: the text is not looked at
    assert first_difference(REF, "", (10, 11, 99, 13, 14), "") == (False, 2, "tokens")
    assert first_difference(REF, "", REF[:3], "") == (False, 3, "tokens")  # a prefix differs where it ends


def test_first_difference_by_text_when_an_answer_has_no_ids() -> None:
    assert first_difference(None, "hello world", REF, "hello there") == (False, 6, "text")
    assert first_difference(REF, "same", None, "same") == (True, None, "text")
    assert first_difference(None, "abc", None, "abcd") == (False, 3, "text")


def _ans(
    prompt: str,
    tokens: tuple[int, ...] | None,
    rnd: int,
    config: str = "spec",
    slice_id: str = "s1",
    status: str = "ok",
    text: str | None = None,
) -> CanaryAnswer:
    return CanaryAnswer(
        1000.0 + rnd,
        config,
        slice_id,
        rnd,
        prompt,
        status,
        text if text is not None else " ".join(map(str, tokens or ())),
        tokens,
    )


def test_compare_against_first_answers_and_the_baseline() -> None:
    firsts = {"a": _ans("a", REF, 1)}
    base = {"a": _ans("a", (10, 11, 12, 13, 15), 1, config="base")}
    got = compare(_ans("a", REF, 2), firsts, base, "base")
    assert got.vs_first == Difference(True, None, "tokens", "first")
    assert got.vs_baseline == Difference(False, 4, "tokens", "base")
    # the reference itself is not compared with itself; an error is compared with nothing
    assert compare(firsts["a"], firsts, {}, None).vs_first is None
    err = compare(_ans("a", None, 3, status="error"), firsts, base, "base")
    assert err.vs_first is None and err.vs_baseline is None


# ---- the rule ---------------------------------------------------------------------------------------------------
def _round(judge: Judge, rnd: int, tokens: dict[str, tuple[int, ...] | None], firsts: dict[str, CanaryAnswer]) -> Any:
    answers = [
        compare(_ans(p, t, rnd, status="ok" if t is not None else "error"), firsts, {}, None) for p, t in tokens.items()
    ]
    return judge.judge(answers, firsts, {})


def test_one_flip_is_the_floor_the_same_flip_twice_in_a_row_is_a_divergence() -> None:
    firsts = {"a": _ans("a", REF, 1), "b": _ans("b", REF, 1)}
    judge = Judge(Rule(confirm_rounds=2, max_differing=1))
    flipped = (10, 11, 77, 78, 79)
    assert _round(judge, 2, {"a": flipped, "b": REF}, firsts) is None  # one answer flipped once: under the floor
    assert _round(judge, 3, {"a": REF, "b": REF}, firsts) is None  # and it came back: the streak ends
    assert _round(judge, 4, {"a": flipped, "b": REF}, firsts) is None
    assert _round(judge, 5, {"a": None, "b": REF}, firsts) is None  # an error neither breaks nor lengthens the streak
    div = _round(judge, 6, {"a": flipped, "b": REF}, firsts)
    assert (
        div is not None and div.prompt_id == "a" and div.first_diff == 2 and div.method == "tokens" and div.rounds == 2
    )
    assert div.reference == "first" and div.ref_text == "10 11 12 13 14" and div.text == "10 11 77 78 79"
    assert "2 consecutive rounds" in div.why
    assert set(div.evidence()) >= {"prompt_id", "first_diff", "text", "ref_text", "method", "reference"}


def test_more_prompts_differing_in_one_round_than_the_floor_allows_is_a_divergence_at_once() -> None:
    firsts = {p: _ans(p, REF, 1) for p in "abc"}
    judge = Judge(Rule(confirm_rounds=5, max_differing=1))
    div = _round(judge, 2, {"a": (1,), "b": (2,), "c": REF}, firsts)
    assert div is not None and div.differing == ["a", "b"] and "2 of 3" in div.why


def test_a_divergence_from_the_baseline_is_judged_apart_from_the_first_answers() -> None:
    firsts = {"a": _ans("a", REF, 1)}
    base = {"a": _ans("a", (10, 11, 12, 99), 1, config="base")}
    judge = Judge(Rule(confirm_rounds=2, max_differing=1))
    assert judge.judge([compare(_ans("a", REF, 2), firsts, base, "base")], firsts, base) is None
    div = judge.judge([compare(_ans("a", REF, 3), firsts, base, "base")], firsts, base)
    assert div is not None and div.reference == "base" and div.first_diff == 3 and div.ref_text == base["a"].text


def test_the_rule_defaults_per_engine_and_the_scenario_overrides_them() -> None:
    sc = _scenario({"canary": {"confirm_rounds": 3}})
    assert rule_of(sc, "llamacpp") == Rule(confirm_rounds=3, max_differing=1, baseline_strict=True)
    assert rule_of(_scenario({}), "llamacpp") == Rule(confirm_rounds=2, max_differing=1, baseline_strict=True)
    assert rule_of(_scenario({}), "sglang") == Rule(confirm_rounds=3, max_differing=1, baseline_strict=False)


def test_where_the_baseline_is_not_strict_only_a_prompt_that_agreed_with_it_at_first_counts() -> None:
    base = {"a": _ans("a", REF, 1, config="base"), "b": _ans("b", REF, 1, config="base")}
    other = (10, 11, 12, 50, 51)
    # "a" differed from the baseline from the start (bfloat16 numerics); "b" agreed with it
    firsts = {"a": compare(_ans("a", other, 1), {}, base, "base"), "b": compare(_ans("b", REF, 1), {}, base, "base")}
    loose, strict = (
        Judge(Rule(confirm_rounds=1, max_differing=5)),
        Judge(Rule(confirm_rounds=1, max_differing=5, baseline_strict=True)),
    )
    later = [compare(_ans("a", other, 2), firsts, base, "base"), compare(_ans("b", REF, 2), firsts, base, "base")]
    assert loose.judge(later, firsts, base) is None
    div = strict.judge(later, firsts, base)
    assert div is not None and div.prompt_id == "a" and div.reference == "base"
    # "b" leaving the baseline counts in both
    changed = [compare(_ans("b", other, 3), firsts, base, "base")]
    div = loose.judge(changed, firsts, base)
    assert div is not None and div.reference == "first" and div.prompt_id == "b"  # its first answer is checked first


# ---- scheduling, records, resume ------------------------------------------------------------------------------
class FakeEngine:
    """Answers each prompt with fixed ids; from ``corrupt_after`` answers on, prompt 'canary-count' comes back changed."""

    def __init__(self, corrupt_after: int | None = None, refuse: bool = False) -> None:
        self.calls = 0
        self.corrupt_after = corrupt_after
        self.refuse = refuse

    def __call__(self, p: Prompt) -> Answer:
        self.calls += 1
        if self.refuse:
            return Answer(p.id, error="HTTPError: HTTP Error 400: Bad Request")
        toks = tuple(range(len(p.id), len(p.id) + 8))
        if self.corrupt_after is not None and self.calls > self.corrupt_after and p.id == "canary-count":
            toks = (*toks[:5], 999, 998, 997)
        return Answer(p.id, " ".join(map(str, toks)), toks, draft_tokens=8, accepted_tokens=6)


def _canary(
    run_dir: Path,
    ask: Any,
    slice_id: str = "spec-s001",
    rule: Rule = _TWO_ROUNDS,
    every_s: float = 10.0,
    baseline: str | None = None,
    config: str = "spec",
) -> Canary:
    return Canary(run_dir, config, slice_id, canary_prompts(None), ask, every_s, rule, baseline, lambda: (4242, 12.5))


def _until_round(c: Canary, t: float) -> tuple[bool, Any]:
    c.poll(t)  # starts the round
    assert c._thread is not None
    c._thread.join(10)
    return c.poll(t)


def test_rounds_are_due_every_every_s_and_a_corrupted_answer_becomes_a_divergence(tmp_path: Path) -> None:
    n = len(canary_prompts(None))
    eng = FakeEngine(corrupt_after=2 * n)  # the third round on
    c = _canary(tmp_path, eng)
    assert c.first_round() is None and eng.calls == n
    t0 = c.next_due
    assert c.poll(t0 - 1.0) == (False, None) and eng.calls == n  # not yet due: nothing sent
    assert _until_round(c, t0) == (True, None) and c.next_due == t0 + 10.0
    assert _until_round(c, t0 + 10.0) == (True, None)  # the first corrupted round: one flip, the floor
    done, div = _until_round(c, t0 + 20.0)
    assert done and div is not None and div.prompt_id == "canary-count" and div.first_diff == 5 and div.rounds == 2
    assert c.summary().diverged and c.summary().differing_first == 1
    c.close()
    recs = list(read_jsonl(tmp_path / CANARY))
    assert len(recs) == 4 * n
    r = recs[-n]
    assert {
        "t_unix",
        "engine_uptime_s",
        "engine_pid",
        "prompt_id",
        "tokens",
        "text",
        "vs_first",
        "round",
        "slice",
    } <= set(r)
    assert r["engine_uptime_s"] == 12.5 and r["engine_pid"] == 4242 and r["round"] == 4 and r["draft_tokens"] == 8
    bad = [x for x in recs if x["vs_first"] and not x["vs_first"]["identical"]]
    assert [x["round"] for x in bad] == [3, 4] and all(x["vs_first"]["first_diff"] == 5 for x in bad)
    assert recs[0]["vs_first"] is None  # the reference itself


def test_a_resumed_soak_compares_with_the_first_answers_already_recorded(tmp_path: Path) -> None:
    n = len(canary_prompts(None))
    c = _canary(tmp_path, FakeEngine())
    c.first_round()
    c.close()
    # the resumed slice's engine answers one prompt differently from its very first answer: still compared with the recorded one
    resumed = _canary(tmp_path, FakeEngine(corrupt_after=0), slice_id="spec-s002", rule=Rule(confirm_rounds=2))
    assert resumed.first_round() is None  # one differing round: the floor
    assert resumed.answers[0].vs_first is not None and resumed.answers[0].vs_first.identical is False
    resumed.close()
    # a second resume replays the streak from the records: the next differing round is the second in a row
    again = _canary(tmp_path, FakeEngine(corrupt_after=0), slice_id="spec-s003")
    div = again.first_round()
    assert div is not None and div.rounds == 2 and div.ref_round == 1
    again.close()
    firsts = first_answers(read_jsonl(tmp_path / CANARY), "spec")
    assert {a.slice for a in firsts.values()} == {"spec-s001"} and len(firsts) == n


def test_the_baselines_recorded_answers_are_the_speculative_configurations_second_reference(tmp_path: Path) -> None:
    base = _canary(tmp_path, FakeEngine(), slice_id="base-s001", config="base")
    base.first_round()
    base.close()
    spec = _canary(tmp_path, FakeEngine(corrupt_after=0), baseline="base")
    spec.first_round()
    spec.close()
    count = next(a for a in spec.answers if a.prompt_id == "canary-count")
    assert count.vs_baseline == Difference(False, 5, "tokens", "base") and count.vs_first is None
    assert spec.summary().differing_baseline == 1


def test_a_refused_canary_prompt_is_an_error_record_and_a_line_never_a_crash(tmp_path: Path) -> None:
    c = _canary(tmp_path, FakeEngine(refuse=True))
    assert c.first_round() is None
    c.close()
    recs = list(read_jsonl(tmp_path / CANARY))
    assert recs and all(r["status"] == "error" and "400" in r["error"] for r in recs)
    assert c.summary().errors == len(recs)
    cell = canary_cell(recs, [], "spec")
    assert (
        cell.startswith("✗ no answer")
        and f"{len(recs)}/{len(recs)} refused or failed (HTTPError: HTTP Error 400" in cell
    )


def test_the_soak_table_cell_and_the_replayed_rounds(tmp_path: Path) -> None:
    n = len(canary_prompts(None))
    c = _canary(tmp_path, FakeEngine(corrupt_after=n))
    c.first_round()
    _until_round(c, c.next_due)
    _, div = _until_round(c, c.next_due)
    c.close()
    recs = list(read_jsonl(tmp_path / CANARY))
    verdict = {
        "config": "spec",
        "kind": "divergence",
        "t_unix": recs[-1]["t_unix"],
        "engine_uptime_s": 7200.0,
        "evidence": div.evidence(),
    }
    cell = canary_cell(recs, [verdict], "spec")
    assert cell.startswith("✗ divergence: canary-count vs its first answer at token 5, engine uptime 2.00 h"), cell
    assert f"2/{2 * n} differ from first answers" in cell and "3 rounds" in cell
    assert canary_cell(recs, [], "other") == "off"
    rows = round_summaries(recs, [verdict])
    assert [r.round for r in rows] == [1, 2, 3]
    assert [r.differing_first for r in rows] == [None, 1, 1]
    assert rows[-1].diverged and not any(r.diverged for r in round_summaries(recs, []))


# ---- scenario, verdict, gauges --------------------------------------------------------------------------------
def _scenario(soak: dict[str, Any], configs: list[dict[str, Any]] | None = None) -> Scenario:
    return Scenario.model_validate(
        {
            "name": "c",
            "server": {"model": "m.gguf"},
            "configurations": configs or [{"name": "base"}, {"name": "spec", "algorithm": "ngram-map-k"}],
            "soak": {"duration_s": 60, **soak},
        }
    )


def test_the_canary_is_on_by_default_only_where_a_speculative_configuration_soaks() -> None:
    assert canary_enabled(_scenario({}))
    assert not canary_enabled(_scenario({}, [{"name": "base"}]))
    assert not canary_enabled(_scenario({"configurations": ["base"]}))
    assert canary_enabled(_scenario({"configurations": ["base"], "canary": {"enabled": True}}))
    assert not canary_enabled(_scenario({"canary": {"enabled": False}}))
    c = _scenario({}).soak.canary  # type: ignore[union-attr]  # _scenario has a soak: section
    assert (c.every_s, c.max_tokens, c.prompts) == (300.0, 64, None)
    with pytest.raises(ValueError, match="every_s"):
        _scenario({"canary": {"every_s": 0}})


def test_divergence_stops_the_configuration_and_fails_its_soak_unless_set_to_record() -> None:
    assert DEFAULT_ACTIONS["divergence"] == "stop_config"
    assert _scenario({"watchdog": {"actions": {"divergence": "record"}}}).soak.watchdog.action("divergence") == "record"  # type: ignore[union-attr]  # has a soak:
    assert verdict_fails({"kind": "divergence", "action": "stop_config"})
    assert not verdict_fails({"kind": "divergence", "action": "record"})


def test_the_exporter_serves_the_last_rounds_differing_answers_and_the_diverged_flag() -> None:
    exp = MetricsExporter(process_reader=None)
    exp.on_config_start("spec", "ngram-map-k", False, "llamacpp", "", None)
    exp.on_canary(CanaryRound("spec", "s1", 1, 100.0, answers=4, errors=1, differing_first=1, differing_baseline=None))
    exp.on_canary(
        CanaryRound("spec", "s1", 2, 400.0, answers=4, errors=0, differing_first=2, differing_baseline=0, diverged=True)
    )
    text = "\n".join(f"{s.name}{s.labels} {s.value}" for fam in exp.registry.collect() for s in fam.samples)
    assert "specsoak_soak_canary_diverged" in text
    val = {
        (s.name, s.labels.get("reference"), s.labels.get("status")): s.value
        for fam in exp.registry.collect()
        for s in fam.samples
        if s.name.startswith("specsoak_soak_canary")
    }
    assert val[("specsoak_soak_canary_differing_answers", "first", None)] == 2
    assert val[("specsoak_soak_canary_differing_answers", "baseline", None)] == 0
    assert val[("specsoak_soak_canary_diverged", None, None)] == 1
    assert (
        val[("specsoak_soak_canary_answers_total", None, "ok")] == 7
        and val[("specsoak_soak_canary_answers_total", None, "error")] == 1
    )
    exp.on_config_end("spec", "done")
    assert not [
        s
        for fam in exp.registry.collect()
        for s in fam.samples
        if s.name in ("specsoak_soak_canary_diverged", "specsoak_soak_canary_differing_answers")
    ]


def test_validate_warns_when_the_canary_would_answer_only_once() -> None:
    from harness.config.checks import soak_warnings

    assert any("soak.canary.every_s" in w for w in soak_warnings(_scenario({})))  # 300 s against a 60-s soak
    assert not any("canary" in w for w in soak_warnings(_scenario({"canary": {"every_s": 20}})))
    assert not any("canary" in w for w in soak_warnings(_scenario({"canary": {"enabled": False}})))


def test_specsoak_export_replays_the_canary_rounds(tmp_path: Path) -> None:
    import json
    import shutil

    from harness.metrics.openmetrics import export_openmetrics

    run = tmp_path / "run"
    shutil.copytree(Path(__file__).resolve().parents[1] / "fixtures" / "run_quick", run)
    req = json.loads((run / "requests.jsonl").read_text().splitlines()[0])
    t = float(req["start_unix_s"])
    first = CanaryAnswer(t, req["config"], "s1", 1, "canary-count", "ok", "a b", (1, 2))
    later = compare(
        CanaryAnswer(t + 0.01, req["config"], "s1", 2, "canary-count", "ok", "a c", (1, 3)),
        {"canary-count": first},
        {},
        None,
    )
    (run / CANARY).write_text("".join(json.dumps(a.to_dict()) + "\n" for a in (first, later)))
    text = export_openmetrics(run)
    lines = [
        ln
        for ln in text.splitlines()
        if ln.startswith("specsoak_soak_canary_differing_answers{") and f'config="{req["config"]}"' in ln
    ]
    assert lines and lines[0].split()[-2] == "1.0" and 'reference="first"' in lines[0]
    assert any(ln.startswith("specsoak_soak_canary_answers_total{") for ln in text.splitlines())
