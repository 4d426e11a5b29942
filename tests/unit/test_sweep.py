"""The K sweep: one configuration expanded into one run per k (and synthetic length)."""

from __future__ import annotations

from pathlib import Path

import pytest
import yaml

from engines.llamacpp import LlamaCpp
from harness.common.errors import ScenarioError
from harness.config.loader import load_scenario
from harness.records.types import Manifest


def _write(tmp_path: Path, cfg: dict) -> Path:
    (tmp_path / "m.gguf").write_bytes(b"GGUF")
    data = {"name": "s", "server": {"model": "m.gguf"}, "configurations": [{"name": "base"}, cfg]}
    p = tmp_path / "s.yaml"
    p.write_text(yaml.safe_dump(data))
    return p


def test_sweep_expands_k_and_synthetic_length(tmp_path: Path) -> None:
    p = _write(
        tmp_path,
        {
            "name": "d",
            "algorithm": "draft-simple",
            "draft": "m.gguf",
            "sweep": {"k": [6, 2, 3], "synthetic_length": [1.5, 2.5]},
        },
    )
    sc = load_scenario(p, LlamaCpp.methods).scenario
    runs = sc.runs()
    assert [r.name for r in runs] == [
        "base",
        "d-k2-L1.5",
        "d-k2-L2.5",
        "d-k3-L1.5",
        "d-k3-L2.5",
        "d-k6-L1.5",
        "d-k6-L2.5",
    ]
    assert all(r.sweep_of == "d" and r.sweep is None for r in runs[1:])
    assert runs[3].k == 3 and runs[3].synthetic is not None and runs[3].synthetic.length == 1.5 and runs[3].is_synthetic


def test_sweep_of_k_alone_keeps_real_acceptance(tmp_path: Path) -> None:
    p = _write(tmp_path, {"name": "ng", "algorithm": "ngram-map-k", "sweep": {"k": [4, 8]}})
    runs = load_scenario(p, LlamaCpp.methods).scenario.runs()
    assert [(r.name, r.k, r.is_synthetic) for r in runs[1:]] == [("ng-k4", 4, False), ("ng-k8", 8, False)]


@pytest.mark.parametrize(
    ("sweep", "extra", "message"),
    [
        ({"k": [1, 2], "synthetic_length": [2.5]}, {}, "synthetic length 2.5 is outside [1, k+1] = [1, 2] for k = 1"),
        ({"k": [2, 2]}, {}, "k values must be distinct"),
        ({"k": [0]}, {}, "greater than or equal to 1"),
        ({"k": [2, 3]}, {"synthetic": {"rates": [0.5, 0.4]}, "k": 2}, "cannot be combined with synthetic.rates"),
    ],
)
def test_bad_sweeps_are_input_errors(tmp_path: Path, sweep: dict, extra: dict, message: str) -> None:
    p = _write(tmp_path, {"name": "d", "algorithm": "draft-simple", "draft": "m.gguf", "sweep": sweep, **extra})
    with pytest.raises(ScenarioError, match=message.replace("[", r"\[").replace("]", r"\]").replace("+", r"\+")):
        load_scenario(p, LlamaCpp.methods)


def test_sweep_names_must_not_clash(tmp_path: Path) -> None:
    (tmp_path / "m.gguf").write_bytes(b"GGUF")
    data = {
        "name": "s",
        "server": {"model": "m.gguf"},
        "configurations": [
            {"name": "d-k2", "algorithm": "ngram-mod"},
            {"name": "d", "algorithm": "ngram-mod", "sweep": {"k": [2]}},
        ],
    }
    p = tmp_path / "s.yaml"
    p.write_text(yaml.safe_dump(data))
    with pytest.raises(ScenarioError, match="'d-k2' is used twice \\(from the sweep of 'd'\\)"):
        load_scenario(p, LlamaCpp.methods)


def test_k_sweep_table_names_the_best_k_per_column() -> None:
    import pandas as pd

    from harness.report.load import RunData
    from harness.report.tables.speculation import k_sweep_table

    cfgs = {
        "base": {"algorithm": "none"},
        "d-k2": {"algorithm": "draft-simple", "k": 2, "sweep_of": "d", "spec": {"name": "d-k2", "k": 2}},
        "d-k4": {"algorithm": "draft-simple", "k": 4, "sweep_of": "d", "spec": {"name": "d-k4", "k": 4}},
    }
    manifest = Manifest.from_dict({"run_id": "r", "configurations": cfgs})
    run = RunData(Path("r"), manifest, pd.DataFrame(), pd.DataFrame(), {}, [])
    verdict = pd.DataFrame(
        [
            {
                "run": "r",
                "config": "base",
                "acceptance": None,
                "mean_accept_len": None,
                "solo_decode_tps": 50.0,
                "total_tps_1": 40.0,
                "total_tps_4": 60.0,
            },
            {
                "run": "r",
                "config": "d-k2",
                "acceptance": 0.8,
                "mean_accept_len": 2.6,
                "solo_decode_tps": 55.0,
                "total_tps_1": 45.0,
                "total_tps_4": 50.0,
            },
            {
                "run": "r",
                "config": "d-k4",
                "acceptance": 0.6,
                "mean_accept_len": 3.1,
                "solo_decode_tps": 58.0,
                "total_tps_1": 44.0,
                "total_tps_4": 41.0,
            },
        ]
    )
    table = k_sweep_table([run], verdict, [1, 4])
    assert list(table["config"]) == ["d-k2", "d-k4"]
    assert list(table["best_for"]) == ["@1, @4", "solo"]


def test_break_even_acceptance_solves_expected_tokens_equals_cost() -> None:
    from harness.common.stats import expected_tokens_per_step
    from harness.report.tables.speculation import break_even_acceptance

    a = break_even_acceptance(2.0, 3)
    assert a is not None and expected_tokens_per_step(a, 3) == pytest.approx(2.0, abs=1e-6)
    assert break_even_acceptance(0.8, 3) == 0.0  # a step cheaper than a plain token always pays
    assert break_even_acceptance(4.5, 3) is None  # K+1 = 4 tokens a step can never pay 4.5
