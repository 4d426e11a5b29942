"""A campaign as Kubernetes work (issue #34, docs/fleet.md): the manifests ``specsoak k8s`` writes.

- the **measure Job**: the scenario without its soak (``specsoak run --no-soak``), every configuration interleaved on
  one node, so every speed ratio is paired on the same hardware;
- one **soak Job per soaked configuration** (``specsoak run --soak-config NAME``): the same measurement on its own node
  (the before side of its after-soak comparison, on the hardware it soaks on), its soak, the phases again after it;
- every pod of the campaign on a node of its own (required pod anti-affinity on the host name): a soak sharing a GPU
  or a CPU with another would measure the other;
- each pod runs what a user runs by hand, results on the volume the user names (``/results/<part>``, one folder per
  part), the exporter on port ``METRICS_PORT`` (a headless Service, a ServiceMonitor and a plain Prometheus scrape
  job select it), the engine's API key from a Secret into the variable ``server.api_key_env`` names;
- a pod that dies is not a lost soak: its replacement finds the part's run folder on the volume and runs
  ``specsoak resume`` (the soak goes on from the records already written); a verdict (exit 1 to 4) ends the Job without
  a retry (the folder says why), a node drained or lost (the pod's DisruptionTarget condition) retries without
  counting against ``backoffLimit``.

Pure: the manifests as Python data; the command writes them as YAML.
"""

from __future__ import annotations

import hashlib
import re
from dataclasses import dataclass, field
from typing import Any

from harness.config.loader import LoadedScenario

METRICS_PORT = 9464
RESULTS = "/results"
SCENARIO_DIR = "/scenario"
GPU_RESOURCE = "nvidia.com/gpu"


def dns_label(text: str, limit: int = 63) -> str:
    """``text`` as a Kubernetes name (RFC 1123 label: lower-case letters, digits and '-', at most ``limit``); a name cut
    short keeps a hash of the whole, so two long names stay apart."""
    name = re.sub(r"[^a-z0-9-]+", "-", text.lower()).strip("-") or "x"
    if len(name) <= limit:
        return name
    digest = hashlib.sha256(text.encode()).hexdigest()[:8]
    return f"{name[: limit - 9].rstrip('-')}-{digest}"


@dataclass(frozen=True)
class Campaign:
    """What the user names for the cluster: the image that holds specsoak and the engine, the volume for the results,
    where the pods may go."""

    image: str
    results_claim: str  # a PersistentVolumeClaim every node can mount (ReadWriteMany, or one node's at a time)
    namespace: str = "default"
    gpus: int = 1  # per pod: nvidia.com/gpu requests and limits (0: a CPU campaign)
    node_selector: dict[str, str] = field(default_factory=dict)
    api_key_secret: str | None = None  # a Secret with key 'api-key': the engine's key, into server.api_key_env
    scenario_file: str = "scenario.yaml"  # the name the scenario has in its ConfigMap


def _labels(name: str, component: str | None = None) -> dict[str, str]:
    out = {"app.kubernetes.io/name": "specsoak", "app.kubernetes.io/instance": name}
    if component is not None:
        out["app.kubernetes.io/component"] = component
    return out


def _script(scenario_path: str, part_dir: str, part_args: list[str]) -> str:
    """The pod's command: resume the part's run folder when a pod before it left one, else start it."""
    serve = f"--metrics-port {METRICS_PORT} --metrics-host 0.0.0.0"
    args = " ".join(part_args)
    return (
        "set -eu\n"
        f'mkdir -p "{part_dir}"\n'
        f'last=$(ls -d "{part_dir}"/*/ 2>/dev/null | tail -n 1 || true)\n'
        'if [ -n "$last" ]; then\n'
        f'  exec specsoak resume "$last" {serve}\n'
        "fi\n"
        f'exec specsoak run "{scenario_path}" --results "{part_dir}" {args} {serve}\n'
    )


def _job(
    loaded: LoadedScenario, c: Campaign, name: str, component: str, part: str, part_args: list[str]
) -> dict[str, Any]:
    job_name = dns_label(f"{name}-{part}")
    labels = {**_labels(name, component), "specsoak.io/part": dns_label(part)}
    env: list[dict[str, Any]] = [{"name": "COLUMNS", "value": "200"}]  # the console's tables whole in `kubectl logs`
    key_env = loaded.scenario.server.api_key_env
    if c.api_key_secret is not None and key_env:
        env.append({"name": key_env, "valueFrom": {"secretKeyRef": {"name": c.api_key_secret, "key": "api-key"}}})
    container: dict[str, Any] = {
        "name": "specsoak",
        "image": c.image,
        "command": ["/bin/sh", "-c", _script(f"{SCENARIO_DIR}/{c.scenario_file}", f"{RESULTS}/{part}", part_args)],
        "env": env,
        "ports": [{"name": "metrics", "containerPort": METRICS_PORT, "protocol": "TCP"}],
        "volumeMounts": [
            {"name": "scenario", "mountPath": SCENARIO_DIR, "readOnly": True},
            {"name": "results", "mountPath": RESULTS},
            {"name": "dshm", "mountPath": "/dev/shm"},  # engines' shared memory (vLLM, NCCL)
        ],
    }
    if c.gpus > 0:
        container["resources"] = {
            "requests": {GPU_RESOURCE: str(c.gpus)},
            "limits": {GPU_RESOURCE: str(c.gpus)},
        }
    pod: dict[str, Any] = {
        "restartPolicy": "Never",
        "affinity": {
            "podAntiAffinity": {
                "requiredDuringSchedulingIgnoredDuringExecution": [
                    {
                        "labelSelector": {"matchLabels": _labels(name)},
                        "topologyKey": "kubernetes.io/hostname",
                    }
                ]
            }
        },
        "containers": [container],
        "volumes": [
            {"name": "scenario", "configMap": {"name": dns_label(f"{name}-scenario")}},
            {"name": "results", "persistentVolumeClaim": {"claimName": c.results_claim}},
            {"name": "dshm", "emptyDir": {"medium": "Memory"}},
        ],
    }
    if c.node_selector:
        pod["nodeSelector"] = dict(c.node_selector)
    return {
        "apiVersion": "batch/v1",
        "kind": "Job",
        "metadata": {"name": job_name, "namespace": c.namespace, "labels": labels},
        "spec": {
            "backoffLimit": 3,
            "podFailurePolicy": {
                "rules": [
                    # specsoak's own exit codes are results (a verdict, bad input, an engine that will not start, a
                    # failed soak): the folder says why, a retry would say it again
                    {
                        "action": "FailJob",
                        "onExitCodes": {"containerName": "specsoak", "operator": "In", "values": [1, 2, 3, 4]},
                    },
                    # drained, preempted or its node lost: the next pod resumes the folder, and it does not count
                    {"action": "Ignore", "onPodConditions": [{"type": "DisruptionTarget", "status": "True"}]},
                ]
            },
            "template": {"metadata": {"labels": labels}, "spec": pod},
        },
    }


def manifests(loaded: LoadedScenario, c: Campaign) -> dict[str, dict[str, Any]]:
    """File name -> manifest, in the order ``kubectl apply`` takes them."""
    sc = loaded.scenario
    name = dns_label(sc.name, 40)  # room for "-soak-<config>" in the Jobs' names
    out: dict[str, dict[str, Any]] = {
        "00-scenario.yaml": {
            "apiVersion": "v1",
            "kind": "ConfigMap",
            "metadata": {"name": dns_label(f"{name}-scenario"), "namespace": c.namespace, "labels": _labels(name)},
            "data": {c.scenario_file: loaded.text},
        },
        "10-measure-job.yaml": _job(loaded, c, name, "measure", "measure", ["--no-soak"]),
    }
    for cfg in sc.soak_configurations():
        part = f"soak-{dns_label(cfg.name, 40)}"
        out[f"20-{part}-job.yaml"] = _job(loaded, c, name, "soak", part, ["--soak-config", _quoted(cfg.name)])
    out["30-metrics-service.yaml"] = {
        "apiVersion": "v1",
        "kind": "Service",
        "metadata": {"name": dns_label(f"{name}-metrics"), "namespace": c.namespace, "labels": _labels(name)},
        "spec": {
            "clusterIP": "None",  # headless: one endpoint per pod, each scraped on its own
            "selector": _labels(name),
            "ports": [{"name": "metrics", "port": METRICS_PORT, "targetPort": "metrics", "protocol": "TCP"}],
        },
    }
    return out


def _quoted(text: str) -> str:
    """``text`` as one word for /bin/sh."""
    return "'" + text.replace("'", "'\"'\"'") + "'"


def service_monitor(loaded: LoadedScenario, c: Campaign) -> dict[str, Any]:
    """For the Prometheus Operator (monitoring.coreos.com/v1, a custom resource: not in the Kubernetes schema)."""
    name = dns_label(loaded.scenario.name, 40)
    return {
        "apiVersion": "monitoring.coreos.com/v1",
        "kind": "ServiceMonitor",
        "metadata": {"name": dns_label(f"{name}-metrics"), "namespace": c.namespace, "labels": _labels(name)},
        "spec": {
            "selector": {"matchLabels": _labels(name)},
            "endpoints": [{"port": "metrics", "interval": "15s"}],
        },
    }


def scrape_config(loaded: LoadedScenario, c: Campaign) -> dict[str, Any]:
    """For a Prometheus without the operator: a scrape job over the campaign's pods (kubernetes_sd_configs)."""
    name = dns_label(loaded.scenario.name, 40)
    return {
        "scrape_configs": [
            {
                "job_name": f"specsoak-{name}",
                "scrape_interval": "15s",
                "kubernetes_sd_configs": [{"role": "pod", "namespaces": {"names": [c.namespace]}}],
                "relabel_configs": [
                    {
                        "source_labels": ["__meta_kubernetes_pod_label_app_kubernetes_io_instance"],
                        "regex": name,
                        "action": "keep",
                    },
                    {
                        "source_labels": ["__meta_kubernetes_pod_container_port_name"],
                        "regex": "metrics",
                        "action": "keep",
                    },
                    {"source_labels": ["__meta_kubernetes_pod_node_name"], "target_label": "node"},
                    {
                        "source_labels": ["__meta_kubernetes_pod_label_specsoak_io_part"],
                        "target_label": "part",
                    },
                ],
            }
        ]
    }
