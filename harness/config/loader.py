"""Scenario files: YAML in, validated pydantic models out.

Every error names the file, the line where YAML can tell it, the field, and what is allowed;
``load_scenario`` raises :class:`ScenarioError` (exit code 2) and starts nothing.
"""

from __future__ import annotations

import os
from collections.abc import Callable
from pathlib import Path
from typing import Any

import yaml
from pydantic import BaseModel, ValidationError

from harness.common.errors import ScenarioError
from harness.config.checks import check_files
from harness.config.schema import Configuration, Scenario, first_model
from harness.models.ref import WORKSHOP_PREFIX, ModelNotFound, resolve_model


class LoadedScenario:
    """A validated scenario with its model paths resolved and its source text kept."""

    def __init__(self, path: Path, text: str, scenario: Scenario, models: dict[str, Path]):
        self.path = path
        self.text = text
        self.scenario = scenario
        self.models = models  # reference string -> resolved path
        # a campaign's part (harness/config/parts.py): {"of": file, "soak": bool, "soak_configs": [...]}; None: whole
        self.part: dict[str, Any] | None = None

    def model_path(self, ref: str) -> Path:
        return self.models[ref]

    def target_of(self, cfg: Configuration) -> Path:
        ref = cfg.model or self.scenario.server.model
        assert ref is not None, "load_scenario sets server.model (from the attached server when the scenario has none)"
        return self.models[ref]


def _with_served_model(p: Path, lines: Any, scenario: Scenario) -> Scenario:
    """Attach mode without server.model: the model the server lists first at /v1/models (what every peer does)."""
    from engines.http import served_models

    srv = scenario.server
    key = os.environ.get(srv.api_key_env) if srv.api_key_env else None
    try:
        names = served_models(str(srv.url), {"Authorization": f"Bearer {key}"} if key else {})
    except OSError as exc:
        loc = ("server", "url")
        raise ScenarioError(
            f"{p}{lines(loc)}: server.model: not given, and the server at {srv.url} did not list its models "
            f"(GET /v1/models: {exc}); start the server or set server.model"
        ) from None
    if not names:
        raise ScenarioError(
            f"{p}: server.model: not given, and the server at {srv.url} lists no model at /v1/models; set server.model"
        )
    return scenario.model_copy(update={"server": srv.model_copy(update={"model": names[0]})})


def load_scenario(
    path: str | Path,
    known_algorithms: frozenset[str] | None = None,
    *,
    check_model_files: bool = True,
    model_folders: bool = False,
) -> LoadedScenario:
    """Read, validate and resolve a scenario; raise ScenarioError naming file, line and field.

    ``check_model_files=False`` checks everything except that the models exist (a GPU scenario
    validated on another machine); ``model_folders`` accepts a folder as a model (Hugging Face
    checkpoints for vLLM, SGLang, TRT-LLM, TGI).
    """
    p = Path(path)
    try:
        text = p.read_text(encoding="utf-8")
    except FileNotFoundError:
        raise ScenarioError(f"{p}: scenario file not found") from None
    except (OSError, UnicodeDecodeError) as exc:
        raise ScenarioError(f"{p}: cannot read scenario file ({exc})") from None
    try:
        data = yaml.load(text, Loader=_UniqueKeyLoader)
    except yaml.YAMLError as exc:
        mark = getattr(exc, "problem_mark", None)
        where = f":{mark.line + 1}:{mark.column + 1}" if mark is not None else ""
        problem = getattr(exc, "problem", None) or str(exc).splitlines()[0]
        raise ScenarioError(f"{p}{where}: YAML syntax error: {problem}") from None
    if not isinstance(data, dict):
        raise ScenarioError(f"{p}: a scenario is a YAML mapping with keys name, server, configurations, measurement")
    try:
        scenario = Scenario.model_validate(data)
    except ValidationError as exc:
        raise ScenarioError(_format_validation(p, text, exc)) from None

    lines = _line_finder(text)
    key_env = scenario.server.api_key_env
    if key_env and not os.environ.get(key_env):
        loc: tuple[Any, ...] = ("server", "api_key_env")
        raise ScenarioError(
            f"{p}{lines(loc)}: {_dotted(loc)}: environment variable '{key_env}' is not set (the API key is read from it)"
        )
    if scenario.server.model is None and scenario.server.url is not None:
        scenario = _with_served_model(p, lines, scenario)
    if known_algorithms is not None:
        for i, cfg in enumerate(scenario.configurations):
            if cfg.algorithm not in known_algorithms:
                loc = ("configurations", i, "algorithm")
                raise ScenarioError(
                    f"{p}{lines(loc)}: {_dotted(loc)}: engine '{scenario.server.engine}' has no method "
                    f"'{cfg.algorithm}'; it has: {', '.join(sorted(known_algorithms))}"
                )
    models: dict[str, Path] = {}
    assert scenario.server.model is not None, (
        "the schema requires server.model without server.url; with one it was read above"
    )
    refs: list[tuple[tuple[Any, ...], str]] = [(("server", "model"), scenario.server.model)]
    for i, cfg in enumerate(scenario.configurations):
        if cfg.model:
            refs.append((("configurations", i, "model"), cfg.model))
        if cfg.draft:
            refs.append((("configurations", i, "draft"), cfg.draft))
    attached = scenario.server.url is not None
    for loc, ref in refs:
        if ref in models:
            continue
        if not check_model_files or attached:  # attached: the model names what the server serves, on its own machine
            if ref.startswith(WORKSHOP_PREFIX):
                from harness.models import WorkshopError, path_for  # checks the name, builds nothing

                try:
                    models[ref] = path_for(ref[len(WORKSHOP_PREFIX) :])
                except WorkshopError as exc:
                    raise ScenarioError(f"{p}{lines(loc)}: {_dotted(loc)}: {exc}") from None
            else:
                models[ref] = Path(ref) if Path(ref).is_absolute() else p.parent / ref
            continue
        try:
            models[ref] = resolve_model(ref, p.parent, allow_folder=model_folders)
        except ModelNotFound as exc:
            raise ScenarioError(f"{p}{lines(loc)}: {_dotted(loc)}: {exc}") from None
    check_files(scenario, p.parent, lambda loc: f"{p}{lines(loc)}: {_dotted(loc)}")
    return LoadedScenario(p, text, scenario, models)


class _UniqueKeyLoader(yaml.SafeLoader):
    """SafeLoader that refuses a key given twice in one mapping (PyYAML keeps the last one silently)."""

    def construct_mapping(self, node: yaml.MappingNode, deep: bool = False) -> dict[Any, Any]:
        seen: set[Any] = set()
        for key_node, _ in node.value:
            key = self.construct_object(key_node, deep=deep)
            if key in seen:
                raise yaml.constructor.ConstructorError(None, None, f"found duplicate key '{key}'", key_node.start_mark)
            seen.add(key)
        return super().construct_mapping(node, deep=deep)


def _dotted(loc: tuple[Any, ...]) -> str:
    out = ""
    for part in loc:
        out += f"[{part}]" if isinstance(part, int) else (f".{part}" if out else str(part))
    return out


def _format_validation(path: Path, text: str, exc: ValidationError) -> str:
    errors = exc.errors(include_url=False)
    first = errors[0]
    loc = tuple(x for x in first["loc"] if not (isinstance(x, str) and x.startswith("function-")))
    field = _dotted(loc) or "(top level)"
    if first["type"] == "extra_forbidden":
        parent = _model_at(loc[:-1])
        allowed = ", ".join(parent.model_fields) if parent else "see docs/scenarios.md"
        msg = f"unknown field '{loc[-1]}'; allowed here: {allowed}"
    elif first["type"] == "missing":
        msg = "required field is missing"
    else:
        msg = first["msg"].removeprefix("Value error, ")
        if "input" in first and first["type"] not in ("model_type", "dict_type"):
            msg += f" (got {first['input']!r})"
    more = f" (and {len(errors) - 1} more error{'s' if len(errors) > 2 else ''})" if len(errors) > 1 else ""
    return f"{path}{_line_finder(text)(loc)}: {field}: {msg}{more}"


def _model_at(loc: tuple[Any, ...]) -> type[BaseModel] | None:
    model: type[BaseModel] = Scenario
    for part in loc:
        if isinstance(part, int):
            continue
        info = model.model_fields.get(str(part))
        if info is None:
            return None
        ann = info.annotation
        inner = first_model(ann)
        if inner is None:
            return None
        model = inner
    return model


def _line_finder(text: str) -> Callable[[tuple[Any, ...]], str]:
    """Map a field location to ':LINE' in the YAML text (the deepest node that exists)."""
    try:
        root = yaml.compose(text)
    except yaml.YAMLError:
        root = None

    def find(loc: tuple[Any, ...]) -> str:
        node = root
        line = None
        for part in loc:
            if node is None:
                break
            if isinstance(node, yaml.MappingNode) and isinstance(part, str):
                nxt = None
                for k, v in node.value:
                    if getattr(k, "value", None) == part:
                        line = k.start_mark.line + 1
                        nxt = v
                        break
                node = nxt
            elif isinstance(node, yaml.SequenceNode) and isinstance(part, int) and part < len(node.value):
                node = node.value[part]
                line = node.start_mark.line + 1
            else:
                break
        return f":{line}" if line is not None else ""

    return find
