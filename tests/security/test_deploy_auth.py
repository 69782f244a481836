"""Compose and Kubernetes carry the same NATS users, secrets and network rules as ``mosaic up``.

Why here and not in tests/test_deploy.py: that file is past the 400-line limit; these checks
reuse its YAML reader. What breaks silently without them: a service started without its
credentials (it would fail to connect only at deploy time), a committed server config that
drifted from the permission table, a secret name no generator makes, a NetworkPolicy that
leaves NATS or the metrics open. The deployments' server config is also run for real: a
nats-server with it and generated passwords admits a service user and refuses an anonymous one.
"""

from __future__ import annotations

import asyncio
import json
import re
import socket
import subprocess
from pathlib import Path
from typing import Any

import nats
import nats.errors
import pytest

from libs.bus.auth import USERS, deploy_server_conf
from libs.bus.server import find_nats_server, free_port
from libs.client.credentials import k8s_secrets, nats_password_env, write_compose_secrets
from tests.test_deploy import COMPOSE, K8S, ROOT, load_yaml, load_yaml_all

CONF = K8S / "nats-server.conf"
# the NATS user each deployed service runs as, by its module
USER_OF = {"gateway": "gateway", "scorer": "scorer", "placer": "placer"}
USER_OF |= {"telemetry": "telemetry", "executor": "executor"}
USER_OF |= {"thermal": "thermal", "defrag": "defrag"}  # issue 14
USER_OF |= {"profiler": "profiler"}  # issue 15


def _module(command: list[str]) -> str:
    """The service a container runs (``services.X`` as its first argument or in a shell line)."""
    found = re.search(r"services\.(\w+)", " ".join(command))
    assert found, command
    return found.group(1)


def test_the_committed_server_config_is_the_generated_one() -> None:
    assert CONF.read_text() == deploy_server_conf(), (
        "deploy/k8s/nats-server.conf is stale: "
        "python -m libs.client.credentials conf > deploy/k8s/nats-server.conf"
    )


def test_the_deployments_server_config_admits_users_and_refuses_strangers(tmp_path: Path) -> None:
    secrets = tmp_path / "secrets"
    creds = write_compose_secrets(secrets)
    env = nats_password_env(creds.passwords)
    # the server reads its passwords as config values: one that looks like a number would fail
    assert all(p[0].isalpha() for p in creds.passwords.values())
    conf = tmp_path / "nats-server.conf"  # the committed file, with a store the test may write
    conf.write_text(CONF.read_text().replace('store_dir: "/data"', f'store_dir: "{tmp_path}/js"'))
    port, http = free_port(), free_port()
    args = [find_nats_server(), "--config", str(conf), "-a", "127.0.0.1", "-p", str(port)]
    args += ["-m", str(http)]
    proc = subprocess.Popen(args, env=env, stdout=subprocess.DEVNULL, stderr=subprocess.PIPE)
    url = f"nats://127.0.0.1:{port}"

    async def check() -> None:
        for _ in range(100):
            if proc.poll() is not None:
                raise AssertionError(f"nats-server refused the config: {proc.stderr.read()!r}")
            try:
                socket.create_connection(("127.0.0.1", port), timeout=0.2).close()
                break
            except OSError:
                await asyncio.sleep(0.1)
        placer = json.loads((secrets / "placer.json").read_text()) | {"servers": [url]}
        nc = await nats.connect(**placer, allow_reconnect=False)
        await nc.flush()
        await nc.close()
        wrong = placer | {"password": creds.passwords["producer"]}
        with pytest.raises((nats.errors.Error, OSError)):
            await nats.connect(**wrong, allow_reconnect=False, connect_timeout=2)
        with pytest.raises((nats.errors.Error, OSError)):
            await nats.connect(url, allow_reconnect=False, connect_timeout=2)

    try:
        asyncio.run(check())
    finally:
        proc.terminate()
        proc.wait(timeout=10)


# --- compose --------------------------------------------------------------------------------------


def test_compose_gives_every_service_its_own_nats_user(tmp_path: Path) -> None:
    compose = load_yaml(COMPOSE)
    top = compose["secrets"]
    made = {p.name for p in write_compose_secrets(tmp_path / "s").directory.iterdir()}
    for name, file in top.items():
        path = Path(file["file"])
        assert path.parent == Path("deploy/compose/secrets"), name
        assert path.name in made, f"secret {name}: no generator writes {path.name}"
    assert compose["x-mosaic-env"]["MOSAIC_METRICS_HOST"] == "0.0.0.0"
    services = {
        n: s for n, s in compose["services"].items() if s.get("image", "").startswith("mosaic:")
    }
    for name, svc in services.items():
        user = USER_OF[_module(svc["command"])]
        env = svc["environment"]
        secret = env["MOSAIC_NATS_CREDS"].removeprefix("/run/secrets/")
        assert secret in svc["secrets"] and top[secret]["file"].endswith(f"/{user}.json"), name
        assert env["MOSAIC_METRICS_HOST"] == "0.0.0.0", name
        assert ("MOSAIC_ADMIN_TOKEN_FILE" in env) == (user == "gateway"), name
    gw = services["gateway"]
    token = gw["environment"]["MOSAIC_ADMIN_TOKEN_FILE"].removeprefix("/run/secrets/")
    assert token in gw["secrets"] and top[token]["file"].endswith("/admin.token")
    nats_svc = compose["services"]["nats"]
    assert "./deploy/compose/secrets/nats.env" in nats_svc["env_file"]
    assert "./deploy/k8s/nats-server.conf:/etc/nats/nats-server.conf:ro" in nats_svc["volumes"]
    assert nats_svc["command"][:2] == ["--config", "/etc/nats/nats-server.conf"]
    assert all(p.startswith("127.0.0.1:") for p in nats_svc["ports"]), "NATS open to the network"
    assert "/deploy/compose/secrets/" in (ROOT / ".gitignore").read_text()


# --- Kubernetes -----------------------------------------------------------------------------------


def _k8s_docs() -> list[dict[str, Any]]:
    docs: list[dict[str, Any]] = []
    for f in sorted(K8S.glob("*.yaml")):
        if f.name != "kustomization.yaml":
            docs += [d for d in load_yaml_all(f.read_text(), f.name) if d]
    return docs


def test_k8s_every_mosaic_pod_mounts_its_own_secret() -> None:
    made = {d["metadata"]["name"]: d for d in load_yaml_all(k8s_secrets()) if d}
    assert {f"mosaic-nats-{u}" for u in USERS} | {"mosaic-nats-passwords"} <= made.keys()
    assert set(made["mosaic-nats-passwords"]["stringData"]) == {
        f"NATS_PASSWORD_{u.upper()}" for u in USERS
    }
    workloads = [d for d in _k8s_docs() if d["kind"] in ("Deployment", "DaemonSet")]
    seen = set()
    for w in workloads:
        pod = w["spec"]["template"]["spec"]
        volumes = {v["name"]: v for v in pod["volumes"]}
        for c in pod["containers"]:
            user = USER_OF[_module(c.get("command", []) + c["args"])]
            seen.add(user)
            env = {e["name"]: e.get("value") for e in c["env"]}
            mounts = {m["mountPath"]: m["name"] for m in c["volumeMounts"]}
            creds = Path(env["MOSAIC_NATS_CREDS"])
            secret = volumes[mounts[str(creds.parent)]]["secret"]["secretName"]
            assert secret == f"mosaic-nats-{user}", w["metadata"]["name"]
            assert creds.name in json.dumps(made[secret]["stringData"]), secret
            if user == "gateway":
                tok = Path(env["MOSAIC_ADMIN_TOKEN_FILE"])
                name = volumes[mounts[str(tok.parent)]]["secret"]["secretName"]
                assert name == "mosaic-admin-token" and tok.name in made[name]["stringData"]
        assert pod["securityContext"]["fsGroup"] == pod["securityContext"]["runAsGroup"]
    assert seen == set(USER_OF.values())
    env_file = dict(line.split("=", 1) for line in (K8S / "common.env").read_text().split())
    assert env_file["MOSAIC_METRICS_HOST"] == "0.0.0.0"


def test_k8s_nats_reads_the_generated_config_and_the_password_secret() -> None:
    sts = next(d for d in _k8s_docs() if d["kind"] == "StatefulSet")
    c = sts["spec"]["template"]["spec"]["containers"][0]
    assert c["args"][:2] == ["--config", "/etc/nats/nats-server.conf"]
    assert {"secretRef": {"name": "mosaic-nats-passwords"}} in c["envFrom"]
    vols = {v["name"]: v for v in sts["spec"]["template"]["spec"]["volumes"]}
    mount = next(m for m in c["volumeMounts"] if m["mountPath"] == "/etc/nats")
    assert vols[mount["name"]]["configMap"]["name"] == "nats-config"
    kust = load_yaml(K8S / "kustomization.yaml")
    gen = {g["name"]: g for g in kust["configMapGenerator"]}
    # the cluster member's config, under the name the container reads (tests/test_deploy_cluster.py)
    assert gen["nats-config"]["files"] == ["nats-server.conf=nats-cluster.conf"]
    assert "network-policies.yaml" in kust["resources"]


def test_k8s_network_policies_open_only_the_gateway() -> None:
    pols = {d["metadata"]["name"]: d["spec"] for d in _k8s_docs() if d["kind"] == "NetworkPolicy"}
    deny = pols["default-deny-ingress"]
    assert (
        deny["podSelector"] == {} and deny["policyTypes"] == ["Ingress"] and "ingress" not in deny
    )
    from_anywhere = {
        n for n, p in pols.items() for rule in p.get("ingress", []) if not rule.get("from")
    }
    assert from_anywhere == {"gateway-from-anywhere"}
    gw = pols["gateway-from-anywhere"]
    assert gw["podSelector"]["matchLabels"]["app.kubernetes.io/component"] == "gateway"
    assert [p["port"] for r in gw["ingress"] for p in r["ports"]] == [8080]

    def admitted(port: int) -> list[dict[str, Any]]:
        return [
            peer
            for p in pols.values()
            for r in p.get("ingress", [])
            if port in [x["port"] for x in r.get("ports", [])]
            for peer in r.get("from", [])
        ]

    assert admitted(4222) == [
        {"podSelector": {"matchLabels": {"app.kubernetes.io/name": "mosaic"}}}
    ]
    for port in (9100, 8222):
        peers = admitted(port)
        assert peers and all(
            p["podSelector"]["matchLabels"] == {"app.kubernetes.io/name": "prometheus"}
            and "namespaceSelector" in p
            for p in peers
        ), port
    # the selectors really select the pods: every Mosaic pod carries name=mosaic
    for w in _k8s_docs():
        if w["kind"] in ("Deployment", "DaemonSet"):
            labels = w["spec"]["template"]["metadata"]["labels"]
            assert labels["app.kubernetes.io/name"] == "mosaic", w["metadata"]["name"]
