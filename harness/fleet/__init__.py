"""A campaign over several machines: Kubernetes manifests, the merged report (docs/fleet.md)."""
