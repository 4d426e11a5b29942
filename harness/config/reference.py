"""docs/scenarios.md, generated from the scenario models (harness/config/schema.py).

Every field of every model reachable from :class:`~harness.config.schema.Scenario`: its dotted path, meaning (the
field's description), unit, default, allowed values and which engines honour it. ``ENGINE_FIELDS`` gathers how an
engine-side field reaches each engine from the adapters (``honoured_fields``); ``specsoak plan`` reads it too. Regenerate the
doc with ``specsoak schema --markdown > docs/scenarios.md``; tests/unit/test_scenario_doc.py fails while the
committed file differs.
"""

from __future__ import annotations

import statistics
from dataclasses import dataclass
from typing import Any, get_args, get_origin

from pydantic import BaseModel
from pydantic.fields import FieldInfo
from pydantic_core import PydanticUndefined

from engines import ENGINES
from harness.config.policy import DEFAULT_ACTIONS
from harness.config.schema import ALGORITHMS, ENGINE_NAMES, Scenario, first_model

REGENERATE = "specsoak schema --markdown > docs/scenarios.md"


# Engine-side fields: dotted path -> {engine: how the field reaches that engine}, from each adapter's honoured_fields
# (engines/*.py). An engine not listed ignores the field (or refuses the configuration at start, as the text says). A
# path not listed here is the harness's own business and means the same on every engine. Attach mode (server.url)
# starts no engine: none of these apply.
def _engine_fields() -> dict[str, dict[str, str]]:
    out: dict[str, dict[str, str]] = {}
    for name, cls in ENGINES.items():
        for path, how in cls.honoured_fields.items():
            out.setdefault(path, {})[name] = how
    return out


ENGINE_FIELDS: dict[str, dict[str, str]] = _engine_fields()

# What an engine that ignores an engine-side field does with it (default: nothing).
IGNORED_BY = {
    "configurations[].draft": "has no method that takes a draft model",
    "server.api_key_env": "takes no API key: the start fails unless server.request_base_url names a proxy that checks it",
    "configurations[].synthetic": "refuses the configuration at start",
    "configurations[].synthetic.length": "refuses the configuration at start",
    "configurations[].synthetic.rates": "refuses the configuration at start",
    "configurations[].sweep.synthetic_length": "refuses the configuration at start",
    "report.fill_check": "records the fill check as 'unsupported': its KV pool is sized from a memory share",
}

# Caveats and what the harness does besides, shown after the engines.
ENGINE_NOTES: dict[str, str] = {
    "server.api_key_env": "every request carries `Authorization: Bearer KEY`",
    "measurement.max_tokens": "tgi: its chat route has no `ignore_eos`, a request may stop sooner",
    "measurement.lengths.input": "tokens counted by the engine's /tokenize on llamacpp and vllm; in words on the others (the build says which)",
    "soak.lengths.input": "tokens counted by the engine's /tokenize on llamacpp and vllm; in words on the others (the build says which)",
    "measurement.lengths.shared_prefix_tokens": "tokens on llamacpp and vllm (/tokenize); words on the others",
    "soak.lengths.shared_prefix_tokens": "tokens on llamacpp and vllm (/tokenize); words on the others",
}

# Units where the name's suffix (_s, _mib, _cores) does not say it, by field name.
UNITS: dict[str, str] = {
    "ctx_size": "tokens",
    "max_tokens": "tokens",
    "k": "tokens",
    "k_min": "tokens",
    "length": "tokens per step",
    "synthetic_length": "tokens per step",
    "rates": "probability",
    "parallel": "slots",
    "threads": "threads",
    "streams": "streams",
    "users": "streams",
    "start_users": "streams",
    "peak_users": "streams",
    "max_streams": "streams",
    "start": "streams",
    "requests_per_stream": "requests",
    "warmup_requests": "requests",
    "min_requests": "requests",
    "spawn_rate": "users per second",
    "workers": "processes",
    "error_rate": "fraction",
    "drift_min_change": "fraction",
    "control_drift_max": "fraction",
    "drift_alpha": "probability",
    "per_stream_tps_min": "tokens per second",
    "ttft_p95_s_max": "seconds",
    "warmup_windows": "windows",
    "reference_windows": "windows",
    "confirm_windows": "windows",
    "drift_min_windows": "windows",
    "max_restarts": "restarts",
    "repetitions": "repetitions",
    "port": "TCP port",
    "rate_rps": "requests per second",
    "trough_rps": "requests per second",
    "requests": "requests",
    "max_in_flight": "requests",
    "cv": "std / mean of the gaps",
    "e2e_s_max": "seconds",
    "shared_prefix_tokens": "tokens",
    "mean": "tokens",
    "sd": "tokens",
    "min": "tokens",
    "max": "tokens",
    "completion_ratio_min": "fraction",
    "late_share_max": "fraction",
    "goodput_ratio_min": "fraction",
    "stop_after": "rates",
}
_SUFFIX_UNITS = (("_s", "seconds"), ("_mib", "MiB"), ("_cores", "CPU cores"))

# Allowed values a validator checks (the JSON schema cannot say them), by dotted path.
ALLOWED: dict[str, str] = {
    "configurations[].algorithm": "an algorithm the engine implements (table: Algorithms by engine)",
    "configurations[].baseline": "the name of a configuration with algorithm `none`",
    "soak.configurations": "names of configurations (a sweep's name stands for all its K values)",
    "measurement.arrival.rate_rps": "a number, or a list of 1 to 64 distinct numbers; each > 0 and ≤ 100000",
    "measurement.arrival.saturation.stop_after": "only with rate_rps (a stage list is one phase)",
}

PROMPT_SET_PURPOSE: dict[str, str] = {
    "repeat": "answers that copy the prompt (rename a variable, edit a config, copy notes): where n-gram lookup and "
    "drafters accept most; the default of `measurement.prompts`",
    "mixed": "chat, questions, maths, translation, a story, two longer texts: ordinary traffic that copies little; "
    "the GPU recipes' measurement",
    "conversations": "the realistic corpus: conversations about real text (standard-library functions to explain, test "
    "and rewrite; passages of the Python reference; docstrings; whole modules), code and prose, one line to "
    "~16,000 characters, most of them multi-turn; built from CPython's own text by `harness/prompts/build_corpus.py` "
    "(origin, licence: harness/prompts/README.md); the overnight and GPU scenarios' set",
    "soak": "the soak's mix: chat, code rewrite and edit, summarisation, translation, questions, maths, one long-context "
    "retrieval and multi-turn conversations whose context grows turn by turn; the default of `soak.prompts`",
}


@dataclass(frozen=True)
class FieldDoc:
    path: str  # dotted: soak.shape.kind, configurations[].k
    name: str
    model: type[BaseModel]
    info: FieldInfo
    schema: dict[str, Any]  # the field's JSON schema
    nested: type[BaseModel] | None  # the model this field holds, when it holds one


def sections(model: type[BaseModel] = Scenario, prefix: str = "") -> list[tuple[str, type[BaseModel]]]:
    """Every model reachable from ``model`` with the path prefix of its fields, depth first."""
    out = [(prefix, model)]
    for name, info in model.model_fields.items():
        inner = first_model(info.annotation)
        if inner is not None:
            out += sections(inner, prefix + name + ("[]." if _is_list(info.annotation) else "."))
    return out


def fields(model: type[BaseModel] = Scenario, prefix: str = "") -> list[FieldDoc]:
    """Every field of every model reachable from ``model``, in section order."""
    out: list[FieldDoc] = []
    for pre, m in sections(model, prefix):
        props = m.model_json_schema().get("properties", {})
        for name, info in m.model_fields.items():
            out.append(FieldDoc(pre + name, name, m, info, props.get(name, {}), first_model(info.annotation)))
    return out


def _is_list(ann: Any) -> bool:
    if get_origin(ann) is list:
        return True
    return any(_is_list(a) for a in get_args(ann) if a is not type(None))


def unit_of(f: FieldDoc) -> str:
    if f.name in UNITS:
        return UNITS[f.name]
    return next((u for suffix, u in _SUFFIX_UNITS if f.name.endswith(suffix)), "")


def default_of(f: FieldDoc) -> str:
    info = f.info
    if info.default is PydanticUndefined and info.default_factory is None:
        return "**required**"
    value = info.default_factory() if info.default_factory is not None else info.default  # type: ignore[call-arg]  # the schema's factories take no argument
    if isinstance(value, BaseModel):
        return "the defaults below"
    if value is None:
        return "unset"
    return f"`{_value(value)}`"


def _value(v: Any) -> str:
    if isinstance(v, bool):
        return "true" if v else "false"
    if isinstance(v, float):
        return str(int(v)) if v.is_integer() else repr(v)
    if isinstance(v, (list, tuple)):
        return "[" + ", ".join(_value(x) for x in v) + "]"
    if isinstance(v, dict):
        return "{" + ", ".join(f"{k}: {_value(x)}" for k, x in v.items()) + "}"
    return str(v) if v != "" else '""'


def type_and_range(f: FieldDoc) -> tuple[str, str]:
    """(type, allowed values) from the field's JSON schema."""
    if f.nested is not None:
        return (
            "list of mappings" if _is_list(f.info.annotation) else "mapping"
        ), f"the fields of `{f.path}{'[]' if _is_list(f.info.annotation) else ''}.*` below"
    t, r = _schema(f.schema)
    return t, ALLOWED.get(f.path, r)


def _schema(s: dict[str, Any]) -> tuple[str, str]:
    if "anyOf" in s:
        opts = [o for o in s["anyOf"] if o.get("type") != "null"]
        parts = [_schema(o) for o in opts]
        types = " or ".join(dict.fromkeys(p[0] for p in parts))
        ranges = "; ".join(p[1] for p in parts if p[1])
        return types, ranges
    if "enum" in s:
        return "string", ", ".join(f"`{v}`" for v in s["enum"])
    typ = s.get("type")
    if typ in ("integer", "number"):
        return typ, _interval(s)
    if typ == "string":
        return "string", f"pattern `{s['pattern']}`" if "pattern" in s else ""
    if typ == "boolean":
        return "boolean", "`true`, `false`"
    if typ == "array":
        it, ir = _schema(s.get("items", {}))
        count = []
        if "minItems" in s:
            count.append(f"at least {s['minItems']}")
        if "maxItems" in s:
            count.append(f"at most {s['maxItems']}")
        n_items = " and ".join(count) + (" item" if count == ["at least 1"] else " items")
        plural = {"integer": "integers", "number": "numbers", "string": "strings"}.get(it, it)
        return f"list of {plural}", "; ".join(x for x in ([f"each {ir}"] if ir else []) + ([n_items] if count else []))
    if typ == "object":
        if "patternProperties" in s:
            ((pat, val),) = s["patternProperties"].items()
            vt, _ = _schema(val)
            return f"mapping of name to {vt}", f"names match `{pat}`"
        keys = s.get("propertyNames", {})
        vt, vr = _schema(s.get("additionalProperties", {}))
        kr = ", ".join(f"`{k}`" for k in keys.get("enum", []))
        return f"mapping of name to {vt}", (f"names: {kr}" if kr else "") + (f"; values: {vr}" if vr else "")
    return str(typ or "any"), ""


def _interval(s: dict[str, Any]) -> str:
    lo = s.get("minimum", s.get("exclusiveMinimum"))
    hi = s.get("maximum", s.get("exclusiveMaximum"))
    left = "(" if "exclusiveMinimum" in s else "["
    right = ")" if "exclusiveMaximum" in s else "]"
    if lo is not None and hi is not None:
        return f"{left}{_value(lo)}, {_value(hi)}{right}"
    if lo is not None:
        return f"{'>' if left == '(' else '≥'} {_value(lo)}"
    if hi is not None:
        return f"{'<' if right == ')' else '≤'} {_value(hi)}"
    return ""


def engines_of(path: str) -> str:
    """Which engines honour the field at ``path``, and how: the doc's 'engines' column."""
    how = ENGINE_FIELDS.get(path)
    note = f"; {ENGINE_NOTES[path]}" if path in ENGINE_NOTES else ""
    if how is None:
        return "all (harness)" + note
    if set(how) == set(ENGINE_NAMES) and len(set(how.values())) == 1:
        return f"all: {next(iter(how.values()))}" + note
    groups: dict[str, list[str]] = {}
    for e in ENGINE_NAMES:
        if e in how:
            groups.setdefault(how[e], []).append(e)
    parts = [f"{', '.join(es)}: {text}" for text, es in groups.items()]
    missing = [e for e in ENGINE_NAMES if e not in how]
    if missing:
        parts.append(f"not {', '.join(missing)}" + (f" ({IGNORED_BY[path]})" if path in IGNORED_BY else " (ignored)"))
    return "; ".join(parts) + note


def ignored_fields(sc: Scenario) -> list[str]:
    """Fields the scenario sets that its engine does not honour (``specsoak plan`` prints them)."""
    engine = sc.server.engine
    out: list[str] = []

    def walk(obj: BaseModel, prefix: str, where: str) -> None:
        for name in sorted(obj.model_fields_set):
            value = getattr(obj, name)
            path = prefix + name
            how = ENGINE_FIELDS.get(path)
            if how is not None and engine not in how and value not in (None, [], {}, False):
                out.append(
                    f"{where}{name}: {engine} does not honour it"
                    + (f"; it {IGNORED_BY[path]}" if path in IGNORED_BY else "")
                )
            if isinstance(value, BaseModel):
                walk(value, path + ".", f"{where}{name}.")
            elif isinstance(value, list) and value and isinstance(value[0], BaseModel):
                for i, item in enumerate(value):
                    walk(item, path + "[].", f"{where}{name}[{i}].")

    walk(sc, "", "")
    return out


# ---- the document ----------------------------------------------------------------------------------------------


def _cell(text: str) -> str:
    return " ".join(str(text).split()).replace("|", "\\|")


def _fields_table(pre: str, model: type[BaseModel], docs: list[FieldDoc]) -> list[str]:
    rows = ["| field | meaning | unit | default | allowed | engines |", "|---|---|---|---|---|---|"]
    for f in docs:
        if f.model is not model or f.path != pre + f.name:
            continue
        t, allowed = type_and_range(f)
        meaning = f.info.description or ""
        rows.append(
            "| "
            + " | ".join(
                _cell(x)
                for x in (
                    f"`{f.path}`",
                    meaning,
                    unit_of(f),
                    default_of(f),
                    f"{t}" + (f": {allowed}" if allowed else ""),
                    engines_of(f.path),
                )
            )
            + " |"
        )
    return rows


def _algorithm_table() -> list[str]:
    rows = ["| algorithm | " + " | ".join(ENGINE_NAMES) + " |", "|---|" + "---|" * len(ENGINE_NAMES)]
    rows.extend(
        f"| `{algo}` | " + " | ".join("yes" if algo in ENGINES[e].methods else "–" for e in ENGINE_NAMES) + " |"
        for algo in sorted(ALGORITHMS)
    )
    return rows


def _prompt_sets_table() -> list[str]:
    from pathlib import Path

    from harness.prompts import BUILTIN_PREFIX, builtin_names, load_prompts

    rows = [
        "| set | prompts | of them conversations | median length, characters | median length, words | purpose |",
        "|---|---:|---:|---:|---:|---|",
    ]
    for name in builtin_names():
        prompts = load_prompts(BUILTIN_PREFIX + name, Path("."))
        texts = [" ".join(m["content"] for m in p.messages) for p in prompts]
        convs = sum(1 for p in prompts if p.followups)
        rows.append(
            f"| `builtin:{name}` | {len(prompts)} | {convs} | {statistics.median(len(t) for t in texts):g} | "
            f"{statistics.median(len(t.split()) for t in texts):g} | "
            f"{_cell(PROMPT_SET_PURPOSE.get(name, '(no description: add it to PROMPT_SET_PURPOSE)'))} |"
        )
    return rows


_INTRO = """\
# Scenario files

A scenario is one YAML file: the engine and how to start it (`server`), the configurations to compare
(`configurations`), the measurement phases (`measurement`), and optionally an overnight soak (`soak`), a service
level for the max-streams ramp (`slo`) and report options (`report`). `specsoak validate SCENARIO` checks a file and
prints the wall-clock estimate; `specsoak plan SCENARIO` prints each configuration's engine command line and the
phases in order; neither starts anything. An unknown field is an error (exit 2) that names the file, line and field.

`specsoak schema` prints the JSON Schema of a scenario for editors (for example the YAML language server:
`# yaml-language-server: $schema=scenario.schema.json` after `specsoak schema > scenario.schema.json`).

Generated from the models in `harness/config/schema.py` and the engine map in `harness/config/reference.py` by
`{regenerate}`; do not edit it by hand.

Columns: **field** is the dotted path (`[]` marks a list item); **engines** says which engines honour a field and
how it reaches them: `all (harness)` is the harness's own business and means the same on every engine.
"""

_PROMPT_FORMAT = """\
## Prompt files

`measurement.prompts` and `soak.prompts` take `builtin:NAME` or a file, relative to the scenario's folder. A file
holds one prompt per line (JSONL) or one JSON list of prompts. A prompt is OpenAI style or ShareGPT style:

```json
{"id": "code-edit", "messages": [{"role": "system", "content": "..."}, {"role": "user", "content": "..."}]}
{"id": "trip", "conversations": [{"from": "human", "value": "..."}, {"from": "gpt", "value": "..."}], "followups": ["...", "..."]}
```

- `id` is optional (default: the line number); request records and replay traces name prompts by it.
- ShareGPT roles `human`, `user`, `gpt`, `assistant`, `system` map to OpenAI roles; a trailing assistant turn is
  dropped (the engine writes it).
- `followups` (optional): later user turns. The soak sends them one by one, each with the conversation so far
  (the engine's own answers included), so the context grows turn after turn; each record keeps its `turn` and
  `prompt_tokens`. The measurement phases send only the first turn.
- Phase (N streams, repetition r) sends the same prompts in every configuration; prompts are taken in order and
  wrap around. So does an open-loop phase (`measurement.arrival`: a rate or the stage list, repetition r), with the
  same send times in every configuration (docs/metrics.md#open-loop-phases).

### Synthetic lengths {#synthetic-lengths}

`measurement.lengths` and `soak.lengths` build the prompts from the set's text instead of sending them as they are
(harness/prompts/lengths.py):

- `input` (a distribution: `fixed` `mean`; `normal` or `lognormal` `mean`, `sd`; `uniform` `min`, `max`; every draw
  rounded and clipped to `[min, max]`): each prompt's user turn is a window of the set's text that many tokens long,
  counted in the target's own tokens through the engine's `/tokenize` and `/detokenize` (llama.cpp, vLLM). The
  window is widened or narrowed until its text, tokenized again, has the drawn length. An engine without a
  tokenizer endpoint (SGLang, TRT-LLM, TGI here) gets lengths in words, and the built file says `counted_in: words`.
  Windows never repeat; each keeps the follow-up turns of the conversation it was cut from, so the soak stays
  multi-turn. Unset: the set's prompts as they are.
- `output`: each prompt's `max_tokens` (requests ask `ignore_eos`, so the answer is that long where the engine
  honours it). Unset: `max_tokens`.
- `shared_prefix_tokens`: a system prompt of that many tokens, the same in every request (prefix-cache traffic).
- `prompts`: how many to build (default: as many as the measured phases send; the soak: 5000); `seed`: the draws.

The prompts are built once per run and target model, on the first engine, and kept in the run folder
(`prompts/measurement-*.jsonl`, `prompts/soak-*.jsonl`, with each prompt's drawn and measured input length): every
configuration, slice and resume sends the same ones.

### Prompt reuse

`measurement.prompt_reuse: forbid`: a configuration's measured phases never send a prompt twice; `specsoak validate`
fails, naming the count needed, when the set (or `lengths.prompts`) holds fewer. `soak.prompt_reuse: forbid`: no
prompt is sent twice in a configuration's soak; Locust processes share the set out and each slice starts past the
prompts earlier slices began; a user that finds the set used up stops, said on Locust's stderr and in
`soak/<slice>-<pid>.exhausted`. `allow` (the default): prompts come round again. The report's Prompts table
(`prompts.csv`) gives each phase's and each soak's distinct prompts and repeats.

### Built-in prompt sets

Computed from `harness/prompts/*.jsonl` and `*.jsonl.gz` (length: the first turn's message text).

"""

_TRACE_FORMAT = """\
## Replay traces

`soak.shape.kind: replay` sends requests at the offsets of `soak.shape.trace`, a JSONL file (relative to the
scenario's folder) read by `harness/load/shapes.py` `load_trace`:

```json
{"t_s": 0.0, "prompt_id": "code-edit"}
{"t_s": 1.25}
{"t_s": 1.3, "prompt_id": "conv-trip"}
```

- `t_s` (required): seconds from the start of the configuration's soak; lines may come in any order (they are sorted).
- `prompt_id` (optional): the `id` of a prompt in `soak.prompts`; without it, or with an id not in the set,
  request i takes prompt i (wrapping around).
- At most `soak.shape.users` requests are in flight; a request whose time has come waits for a free one. Once the
  trace is exhausted no more requests are sent (the watchdog may then call `no_load`). A resumed or sliced soak
  skips the offsets it has already passed.
- A missing trace file is bad input (exit 2) at `specsoak validate`; a line without a numeric `t_s` is an error
  that names the file and line.
"""


def markdown() -> str:
    """docs/scenarios.md."""
    docs = fields()
    out = [_INTRO.format(regenerate=REGENERATE)]
    for pre, model in sections():
        title = f"`{pre.rstrip('.')}`" if pre else "Top level"
        out.append(f"## {title}\n")
        doc = (model.__doc__ or "").strip()
        if doc and not doc.startswith(model.__name__ + "("):
            out.append(" ".join(doc.split()) + "\n")
        out.append("\n".join(_fields_table(pre, model, docs)) + "\n")
        if model.__name__ == "Configuration":
            out.append("### Algorithms by engine\n")
            out.append("From each adapter's `methods` (`engines/*.py`); `none` is the baseline.\n")
            out.append("\n".join(_algorithm_table()) + "\n")
        if model.__name__ == "Watchdog":
            out.append(
                "Default actions (`soak.watchdog.actions` overrides them): "
                + ", ".join(f"`{k}`: {v}" for k, v in DEFAULT_ACTIONS.items())
                + ".\n"
            )
    out.append(_PROMPT_FORMAT + "\n".join(_prompt_sets_table()) + "\n")
    out.append(_TRACE_FORMAT)
    return "\n".join(out)


if __name__ == "__main__":
    print(markdown(), end="")
