"""Compose and Kubernetes restart what ``/healthz`` calls unhealthy: every Mosaic service has a
health check on its metrics port, so a live process with a dead loop or lease task is seen."""

from __future__ import annotations

from typing import Any

from tests.test_deploy import _k8s_docs, _mosaic_services, _pod_spec, compose  # noqa: F401


def test_compose_checks_healthz_on_the_metrics_port(compose: dict[str, Any]) -> None:  # noqa: F811
    port = compose["x-mosaic-env"]["MOSAIC_METRICS_PORT"]
    for name, svc in _mosaic_services(compose).items():
        test = " ".join(svc["healthcheck"]["test"])
        assert f"127.0.0.1:{port}/healthz" in test or f"{port})" in test, name
        assert "healthz" in test, name


def test_k8s_liveness_probes_hit_healthz() -> None:
    seen = 0
    for doc in _k8s_docs():
        pod = _pod_spec(doc)
        if pod is None:
            continue
        for c in pod["containers"]:
            if c.get("image") != "mosaic":
                continue
            probe = c["livenessProbe"]["httpGet"]
            assert probe["path"] == "/healthz", doc["metadata"]["name"]
            seen += 1
    assert seen >= 4  # placer, scorer, gateway, the node agents
