"""The part of a scenario one machine of a campaign runs (issue #34, docs/fleet.md): the measurement without the soak
(the interleaved speed comparison, on one node), or the soak of only some configurations (each on its own node).

The part is a scenario in its own right: its text (the run folder's scenario.yaml, what ``specsoak resume`` reads)
is the original with the soak removed or its ``configurations`` narrowed, under a comment that says so.
"""

from __future__ import annotations

from collections.abc import Sequence

import yaml

from harness.common.errors import ScenarioError
from harness.config.loader import LoadedScenario


def campaign_part(loaded: LoadedScenario, soak: bool = True, soak_configs: Sequence[str] = ()) -> LoadedScenario:
    """``loaded`` without its soak (``soak`` False), or soaking only ``soak_configs`` (each a configuration the
    scenario soaks); unchanged when neither is asked."""
    sc = loaded.scenario
    if soak and not soak_configs:
        return loaded
    where = f"{loaded.path}"
    if not soak and soak_configs:
        raise ScenarioError(f"{where}: --no-soak and --soak-config together: a part without a soak soaks nothing")
    if soak_configs and sc.soak is None:
        raise ScenarioError(f"{where}: --soak-config {', '.join(soak_configs)}: the scenario has no soak section")
    data = yaml.safe_load(loaded.text) or {}
    if not soak:
        data.pop("soak", None)
        new = sc.model_copy(update={"soak": None})
        said = "the measurement only (--no-soak)"
    else:
        assert sc.soak is not None
        soaked = [c.name for c in sc.soak_configurations()]
        unknown = [n for n in soak_configs if n not in soaked]
        if unknown:
            raise ScenarioError(
                f"{where}: soak.configurations: --soak-config {', '.join(unknown)} is not a configuration this scenario "
                f"soaks ({', '.join(soaked) or 'none'})"
            )
        names = list(dict.fromkeys(soak_configs))
        data.setdefault("soak", {})["configurations"] = names
        new = sc.model_copy(update={"soak": sc.soak.model_copy(update={"configurations": names})})
        said = f"the soak of {', '.join(names)} only (--soak-config)"
    header = f"# A campaign's part: {said}, from {loaded.path.name} (specsoak run, docs/fleet.md)\n"
    text = header + yaml.safe_dump(data, sort_keys=False, allow_unicode=True)
    part = LoadedScenario(loaded.path, text, new, loaded.models)
    # the manifest says which part this is, so `specsoak report` can merge the campaign's folders (report/campaign.py)
    part.part = {"of": loaded.path.name, "soak": soak, "soak_configs": list(dict.fromkeys(soak_configs))}
    return part
