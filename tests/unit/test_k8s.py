"""A campaign as Kubernetes work (issue #34, docs/fleet.md): `specsoak k8s` writes manifests that validate against
the Kubernetes schema (kubernetes-validate, offline, strict: no field Kubernetes does not know), one measure Job and
one soak Job per soaked configuration, each on a node of its own; the pod's command runs the part a user would run,
and resumes the part's folder when a pod before it left one; `specsoak run --no-soak` / `--soak-config` are those
parts, written to the run folder as a scenario of their own."""

from __future__ import annotations

import os
import stat
import subprocess
import sys
from pathlib import Path
from typing import Any

import kubernetes_validate
import pytest
import yaml

from harness.common.errors import ScenarioError
from harness.config.loader import load_scenario
from harness.config.parts import campaign_part
from harness.fleet.k8s import Campaign, dns_label, manifests

ROOT = Path(__file__).resolve().parents[2]
K8S_VERSION = "1.33.0"  # podFailurePolicy is GA from 1.31; kubernetes-validate 1.37 holds the schemas up to 1.37
SCENARIOS = {
    "overnight.yaml": 0,  # the CPU campaign
    "vllm-soak-gpu.yaml": 1,  # a GPU one: one nvidia.com/gpu per pod
}


def _k8s(tmp_path: Path, scenario: str, *extra: str) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        [
            sys.executable,
            "-m",
            "harness.cli",
            "k8s",
            str(ROOT / "scenarios" / scenario),
            "--out",
            str(tmp_path / "k8s"),
            "--image",
            "registry.example/specsoak:0.1.0",
            "--results-claim",
            "specsoak-results",
            *extra,
        ],
        capture_output=True,
        text=True,
        timeout=120,
        check=False,
        cwd=ROOT,
    )


@pytest.mark.parametrize(("scenario", "gpus"), list(SCENARIOS.items()))
def test_the_manifests_validate_against_the_kubernetes_schema(tmp_path: Path, scenario: str, gpus: int) -> None:
    done = _k8s(tmp_path, scenario, "--gpus", str(gpus), "--node-selector", "nvidia.com/gpu.product=NVIDIA-H100")
    assert done.returncode == 0, done.stderr
    folder = tmp_path / "k8s"
    docs = {p.name: yaml.safe_load(p.read_text()) for p in sorted(folder.glob("*.yaml"))}
    kustomized = docs.pop("kustomization.yaml")["resources"]
    assert sorted(kustomized) == sorted(n for n in docs if n[:2].isdigit())
    for name in kustomized:
        # strict: an unknown or misplaced field is an error, as the API server's field validation would say
        kubernetes_validate.validate(docs[name], K8S_VERSION, strict=True)
    loaded = load_scenario(ROOT / "scenarios" / scenario, check_model_files=False)
    soaked = [c.name for c in loaded.scenario.soak_configurations()]
    jobs = [docs[n] for n in kustomized if docs[n]["kind"] == "Job"]
    assert len(jobs) == 1 + len(soaked) >= 2
    commands = [j["spec"]["template"]["spec"]["containers"][0]["command"][2] for j in jobs]
    assert "--no-soak" in commands[0] and "--soak-config" not in commands[0]
    for name, cmd in zip(soaked, commands[1:], strict=True):
        assert f"--soak-config '{name}'" in cmd and "--no-soak" not in cmd
    for job in jobs:
        pod = job["spec"]["template"]["spec"]
        container = pod["containers"][0]
        # every pod of the campaign on a node of its own, on the nodes named, with the GPUs asked
        term = pod["affinity"]["podAntiAffinity"]["requiredDuringSchedulingIgnoredDuringExecution"][0]
        assert term["topologyKey"] == "kubernetes.io/hostname"
        assert term["labelSelector"]["matchLabels"].items() <= job["spec"]["template"]["metadata"]["labels"].items()
        assert pod["nodeSelector"] == {"nvidia.com/gpu.product": "NVIDIA-H100"}
        assert container.get("resources", {}).get("limits", {}).get("nvidia.com/gpu") == (str(gpus) if gpus else None)
        assert {"name": "metrics", "containerPort": 9464, "protocol": "TCP"} in container["ports"]
        # a verdict ends the Job; a drained node does not count against its retries
        rules = job["spec"]["podFailurePolicy"]["rules"]
        assert [r["action"] for r in rules] == ["FailJob", "Ignore"]
    # the scenario the pods read is the file, whole
    [configmap] = [docs[n] for n in kustomized if docs[n]["kind"] == "ConfigMap"]
    assert configmap["data"][scenario] == (ROOT / "scenarios" / scenario).read_text()
    # Prometheus finds the pods: the Service's and ServiceMonitor's selectors match the pods' labels
    [service] = [docs[n] for n in kustomized if docs[n]["kind"] == "Service"]
    monitor = docs["servicemonitor.yaml"]
    labels = jobs[0]["spec"]["template"]["metadata"]["labels"]
    assert service["spec"]["selector"].items() <= labels.items()
    assert monitor["spec"]["selector"]["matchLabels"].items() <= labels.items()
    scrape = docs["prometheus-scrape.yaml"]["scrape_configs"][0]
    assert scrape["relabel_configs"][0]["regex"] == labels["app.kubernetes.io/instance"]


def test_a_manifest_kubernetes_would_refuse_is_caught_by_the_validation() -> None:
    # the check the test above relies on can fail: a misspelt field, and a GPU count given as a list
    loaded = load_scenario(ROOT / "scenarios" / "overnight.yaml", check_model_files=False)
    job = manifests(loaded, Campaign("img", "pvc"))["10-measure-job.yaml"]
    bad: dict[str, Any] = yaml.safe_load(yaml.safe_dump(job))
    bad["spec"]["template"]["spec"]["restartPolicey"] = "Never"
    with pytest.raises(kubernetes_validate.ValidationError):
        kubernetes_validate.validate(bad, K8S_VERSION, strict=True)
    bad = yaml.safe_load(yaml.safe_dump(job))
    bad["spec"]["backoffLimit"] = "three"
    with pytest.raises(kubernetes_validate.ValidationError):
        kubernetes_validate.validate(bad, K8S_VERSION, strict=True)


def test_names_are_kubernetes_names() -> None:
    assert dns_label("Overnight_CPU v2") == "overnight-cpu-v2"
    long = dns_label("x" * 100)
    assert len(long) == 63 and long != dns_label("x" * 99)


def _fake_specsoak(folder: Path) -> Path:
    """A `specsoak` on PATH that says how it was called."""
    bin_dir = folder / "bin"
    bin_dir.mkdir()
    exe = bin_dir / "specsoak"
    exe.write_text('#!/bin/sh\necho "specsoak $*"\n')
    exe.chmod(exe.stat().st_mode | stat.S_IEXEC)
    return bin_dir


def test_the_pod_runs_its_part_and_a_pod_after_it_resumes_the_folder(tmp_path: Path) -> None:
    loaded = load_scenario(ROOT / "scenarios" / "overnight.yaml", check_model_files=False)
    docs = manifests(loaded, Campaign("img", "pvc"))
    soak_job = next(d for n, d in docs.items() if n.startswith("20-"))
    script = soak_job["spec"]["template"]["spec"]["containers"][0]["command"][2]
    results = tmp_path / "results"
    script = script.replace("/results/", f"{results}/").replace("/scenario/", f"{tmp_path}/scenario/")
    env = {**os.environ, "PATH": f"{_fake_specsoak(tmp_path)}:{os.environ['PATH']}"}
    first = subprocess.run(["/bin/sh", "-c", script], capture_output=True, text=True, env=env, check=True)
    assert first.stdout.startswith(f"specsoak run {tmp_path}/scenario/scenario.yaml --results {results}/soak-")
    assert "--soak-config" in first.stdout and "--metrics-host 0.0.0.0" in first.stdout
    # the pod died mid-soak: its run folder is on the volume, the next pod resumes it
    part = next(results.iterdir())
    (part / "20261205T000000Z-overnight").mkdir()
    again = subprocess.run(["/bin/sh", "-c", script], capture_output=True, text=True, env=env, check=True)
    assert again.stdout.startswith(f"specsoak resume {part}/20261205T000000Z-overnight/")


def test_a_part_of_a_scenario_is_a_scenario_of_its_own(tmp_path: Path) -> None:
    path = ROOT / "scenarios" / "soak-2h-cpu.yaml"
    loaded = load_scenario(path, check_model_files=False)
    measure = campaign_part(loaded, soak=False)
    assert measure.scenario.soak is None and measure.text.startswith("# A campaign's part: the measurement only")
    soak = campaign_part(loaded, soak_configs=["ngram-map-k"])
    assert [c.name for c in soak.scenario.soak_configurations()] == ["ngram-map-k"]
    assert [c.name for c in soak.scenario.runs()] == ["baseline", "ngram-map-k"]  # measured on its node too
    for part in (measure, soak):  # the run folder's copy reads back as the part (what resume runs)
        copy = tmp_path / "scenario.yaml"
        copy.write_text(part.text)
        again = load_scenario(copy, check_model_files=False).scenario
        assert again.model_dump() == part.scenario.model_dump()
    assert campaign_part(loaded) is loaded
    with pytest.raises(ScenarioError, match=r"soak\.configurations: --soak-config nope is not a configuration"):
        campaign_part(loaded, soak_configs=["nope"])
    with pytest.raises(ScenarioError, match="--no-soak and --soak-config together"):
        campaign_part(loaded, soak=False, soak_configs=["baseline"])


def test_bad_k8s_options_are_bad_input(tmp_path: Path) -> None:
    done = _k8s(tmp_path, "overnight.yaml", "--node-selector", "no-equals-sign")
    assert done.returncode == 2 and "--node-selector 'no-equals-sign': give KEY=VALUE" in done.stderr
