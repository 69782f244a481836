"""Compose and Kubernetes run NATS as a 3-server JetStream cluster with R3 streams.

Why these checks: each piece is easy to get subtly wrong and only fails at deploy time, under a
fault: a member without its own store, routes that do not carry the route password (the cluster
never forms), a route port open to every pod, a disruption budget that lets a drain take two of
three (JetStream stops), services left at one replica per stream (a lost server loses data), a
committed config that drifted from the generator. The committed cluster config is also run for
real: three nats-servers from it, routed as the StatefulSet routes them, form a cluster, keep an
R3 stream through the loss of its leader, and refuse a fourth server with a wrong route password.
(tests/test_deploy.py is past the 400-line limit; this file reuses its YAML reader.)
"""

from __future__ import annotations

import asyncio
import json
import re
import subprocess
import time
import urllib.request
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import nats
import nats.errors
import pytest
from nats.js import api

from libs.bus.auth import ADMIN, ROUTE_USER, deploy_server_conf
from libs.bus.server import find_nats_server, free_port
from libs.client.credentials import (
    COMPOSE_NATS_MEMBERS,
    Credentials,
    k8s_secrets,
    nats_password_env,
    write_compose_secrets,
)
from tests.test_deploy import COMPOSE, K8S, ROOT, load_yaml, load_yaml_all

CLUSTER_CONF = K8S / "nats-cluster.conf"
OVERRIDE = ROOT / "deploy" / "compose" / "cluster.override.yml"
NATS_LABEL = {"app.kubernetes.io/name": "nats"}


def _k8s(kind: str, name: str) -> dict[str, Any]:
    for f in sorted(K8S.glob("*.yaml")):
        for d in load_yaml_all(f.read_text(), f.name):
            if d and d.get("kind") == kind and d["metadata"]["name"] == name:
                return d
    raise AssertionError(f"no {kind} {name} in {K8S}")


def _nats_container() -> dict[str, Any]:
    sts = _k8s("StatefulSet", "nats")
    return next(c for c in sts["spec"]["template"]["spec"]["containers"] if c["name"] == "nats")


def _manifest_routes() -> str:
    env = {e["name"]: e.get("value") for e in _nats_container()["env"]}
    return env["NATS_ROUTES"]


# --- the generated config -------------------------------------------------------------------------


def test_the_committed_cluster_config_is_the_generated_one() -> None:
    assert CLUSTER_CONF.read_text() == deploy_server_conf(cluster=True), (
        "deploy/k8s/nats-cluster.conf is stale: "
        "python -m libs.client.credentials conf --cluster > deploy/k8s/nats-cluster.conf"
    )
    text = CLUSTER_CONF.read_text()
    assert "password: $NATS_ROUTE_PASSWORD" in text and "routes: $NATS_ROUTES" in text
    assert "cluster {" not in deploy_server_conf()  # the single server's (compose) has none


# --- Kubernetes -----------------------------------------------------------------------------------


def test_k8s_nats_is_three_members_each_with_its_store_and_routes() -> None:
    sts = _k8s("StatefulSet", "nats")
    spec = sts["spec"]
    assert spec["replicas"] == 3 and spec["podManagementPolicy"] == "Parallel"
    claim = spec["volumeClaimTemplates"][0]
    assert claim["metadata"]["name"] == "data" and claim["spec"]["accessModes"] == ["ReadWriteOnce"]
    c = _nats_container()
    assert {"mountPath": "/data", "name": "data"} in c["volumeMounts"]
    assert {"name": "cluster", "containerPort": 6222} in c["ports"]
    assert {"secretRef": {"name": "mosaic-nats-route"}} in c["envFrom"]
    assert c["startupProbe"]["httpGet"]["path"] == "/healthz"  # current again before Ready
    headless = _k8s("Service", spec["serviceName"])["spec"]
    assert headless["clusterIP"] == "None" and headless["publishNotReadyAddresses"] is True
    assert 6222 in [p["port"] for p in headless["ports"]]
    # the routes: every member by its stable name, the route user and the Secret's password
    urls = json.loads(_manifest_routes())
    want = [
        f"nats-route://{ROUTE_USER}:$(NATS_ROUTE_PASSWORD)@nats-{i}.{spec['serviceName']}:6222"
        for i in range(spec["replicas"])
    ]
    assert urls == want
    affinity = spec["template"]["spec"]["affinity"]["podAntiAffinity"]
    (term,) = affinity["preferredDuringSchedulingIgnoredDuringExecution"]
    assert term["podAffinityTerm"]["labelSelector"]["matchLabels"] == NATS_LABEL


def test_k8s_services_use_three_replicas_and_the_route_secret_is_generated() -> None:
    env = dict(line.split("=", 1) for line in (K8S / "common.env").read_text().split())
    assert env["MOSAIC_STREAM_REPLICAS"] == str(_k8s("StatefulSet", "nats")["spec"]["replicas"])
    made = {d["metadata"]["name"]: d for d in load_yaml_all(k8s_secrets()) if d}
    password = made["mosaic-nats-route"]["stringData"]["NATS_ROUTE_PASSWORD"]
    assert password[0].isalpha() and re.fullmatch(r"[A-Za-z0-9_-]{40,}", password)


def test_k8s_routes_are_open_between_nats_pods_only_and_a_drain_takes_one() -> None:
    pol = _k8s("NetworkPolicy", "nats-routes-between-members")["spec"]
    assert pol["podSelector"]["matchLabels"] == NATS_LABEL
    assert pol["ingress"] == [
        {
            "from": [{"podSelector": {"matchLabels": NATS_LABEL}}],
            "ports": [{"port": 6222, "protocol": "TCP"}],
        }
    ]
    pdb = _k8s("PodDisruptionBudget", "nats")["spec"]
    assert pdb["maxUnavailable"] == 1 and pdb["selector"]["matchLabels"] == NATS_LABEL
    pod_labels = _k8s("StatefulSet", "nats")["spec"]["template"]["metadata"]["labels"]
    assert NATS_LABEL.items() <= pod_labels.items()


# --- compose --------------------------------------------------------------------------------------


def _merged(base: dict[str, Any], override: dict[str, Any]) -> dict[str, Any]:
    """A service as ``docker compose -f base -f override`` merges it: mappings merged by key,
    volumes by their target, ``command`` replaced."""
    out = dict(base)
    for key, value in override.items():
        if key in ("environment", "depends_on"):
            out[key] = {**base.get(key, {}), **value}
        elif key == "volumes":
            by_target = {v.split(":")[1]: v for v in base.get(key, [])}
            by_target |= {v.split(":")[1]: v for v in value}
            out[key] = list(by_target.values())
        else:
            out[key] = value
    return out


def test_compose_profile_and_override_make_a_three_member_cluster(tmp_path: Path) -> None:
    compose = load_yaml(COMPOSE)["services"]
    override = load_yaml(OVERRIDE)["services"]
    members = [s for s in compose if s == "nats" or compose[s].get("profiles") == ["nats-cluster"]]
    assert tuple(members) == COMPOSE_NATS_MEMBERS
    merged = {n: _merged(compose[n], override.get(n, {})) for n in compose}
    volumes = set()
    for name in members:
        svc = merged[name]
        assert svc["command"][-2:] == ["--server_name", name], name
        assert "./deploy/k8s/nats-cluster.conf:/etc/nats/nats-server.conf:ro" in svc["volumes"]
        assert "./deploy/compose/secrets/nats.env" in svc["env_file"]
        (data,) = [v.split(":")[0] for v in svc["volumes"] if v.endswith(":/data")]
        volumes.add(data)
    assert len(volumes) == 3, "each member needs its own JetStream store"
    mosaic = {n: s for n, s in merged.items() if str(s.get("image", "")).startswith("mosaic:")}
    assert mosaic.keys() == override.keys() - {"nats"}, "every Mosaic service goes to the cluster"
    for name, svc in mosaic.items():
        env = svc["environment"]
        urls = env["MOSAIC_NATS_URL"].split(",")
        assert urls == [f"nats://{m}:4222" for m in members], name
        assert env["MOSAIC_STREAM_REPLICAS"] == "3", name
        assert all(svc["depends_on"][m]["condition"] == "service_healthy" for m in members), name
    # nats.env (the same generator as the users' passwords) routes exactly these members
    write_compose_secrets(tmp_path)
    env_file = dict(
        line.split("=", 1) for line in (tmp_path / "nats.env").read_text().split("\n") if line
    )
    password = env_file["NATS_ROUTE_PASSWORD"]
    assert json.loads(env_file["NATS_ROUTES"]) == [
        f"nats-route://{ROUTE_USER}:{password}@{m}:6222" for m in members
    ]


# --- the config for real: three servers from it ---------------------------------------------------


class _Member:
    def __init__(self, tmp: Path, i: int, routes: list[int], env: dict[str, str]) -> None:
        self.port, self.http = free_port(), free_port()
        conf = tmp / f"m{i}.conf"  # the committed file, loopback ports and a store of its own
        text = CLUSTER_CONF.read_text().replace('store_dir: "/data"', f'store_dir: "{tmp}/js{i}"')
        conf.write_text(text.replace('listen: "0.0.0.0:6222"', f'listen: "127.0.0.1:{routes[i]}"'))
        args = [find_nats_server(), "--config", str(conf), "-a", "127.0.0.1", "-p", str(self.port)]
        args += ["-m", str(self.http), "--server_name", f"nats-{i}"]
        self.log = tmp / f"m{i}.log"
        with self.log.open("wb") as log:
            self.proc = subprocess.Popen(args, env=env, stdout=log, stderr=subprocess.STDOUT)

    def get(self, path: str) -> dict[str, Any]:
        with urllib.request.urlopen(f"http://127.0.0.1:{self.http}{path}", timeout=2) as resp:
            return json.load(resp)

    def healthy(self) -> bool:
        try:
            return self.get("/healthz")["status"] == "ok"
        except OSError:
            return False

    def stop(self) -> None:
        if self.proc.poll() is None:
            self.proc.kill()
            self.proc.wait(timeout=10)


def _env(creds: Credentials, route_pw: str, routes: list[int]) -> dict[str, str]:
    """The pod's environment: the passwords Secret, the route Secret, and NATS_ROUTES as
    Kubernetes expands the StatefulSet's value, pod names pointed at loopback ports."""
    value = _manifest_routes().replace("$(NATS_ROUTE_PASSWORD)", route_pw)
    for i, port in enumerate(routes):
        value = value.replace(f"nats-{i}.nats-headless:6222", f"127.0.0.1:{port}")
    return nats_password_env(creds.passwords) | {
        "NATS_ROUTE_PASSWORD": route_pw,
        "NATS_ROUTES": value,
    }


@pytest.fixture
def members(tmp_path: Path) -> Iterator[tuple[list[_Member], Credentials, list[int]]]:
    creds = Credentials.generate(tmp_path / "creds")
    routes = [free_port() for _ in range(3)]
    env = _env(creds, "Route" + creds.admin_token, routes)
    started = [_Member(tmp_path, i, routes, env) for i in range(3)]
    try:
        yield started, creds, routes
    finally:
        for m in started:
            m.stop()


def _wait(predicate: Any, what: str, timeout_s: float = 30.0) -> None:
    deadline = time.monotonic() + timeout_s
    while not predicate():
        assert time.monotonic() < deadline, what
        time.sleep(0.2)


# make test-all (test time): the committed cluster config is also checked statically here
@pytest.mark.slow
def test_three_servers_from_the_config_keep_an_r3_stream_through_a_lost_leader(
    members: tuple[list[_Member], Credentials, list[int]], tmp_path: Path
) -> None:
    servers, creds, routes = members
    _wait(lambda: all(m.healthy() for m in servers), "the cluster never formed")
    assert servers[0].get("/jsz")["meta_cluster"]["cluster_size"] == 3
    urls = [f"nats://{ADMIN}:{creds.passwords[ADMIN]}@127.0.0.1:{m.port}" for m in servers]

    async def run() -> None:
        nc = await nats.connect(urls, connect_timeout=2, reconnect_time_wait=0.2)
        try:
            js = nc.jetstream()
            await js.add_stream(api.StreamConfig(name="R3", subjects=["r3.>"], num_replicas=3))
            for i in range(20):
                await js.publish(f"r3.{i}", b"x", timeout=10)
            leader = (await js.stream_info("R3")).cluster.leader
            servers[int(leader.removeprefix("nats-"))].stop()
            deadline = time.monotonic() + 30
            for i in range(20, 40):  # a new leader is elected; a publish may time out meanwhile
                once = {"Nats-Msg-Id": f"r3-{i}"}  # a retry after a lost ack is not a second one
                while True:
                    try:
                        await js.publish(f"r3.{i}", b"x", timeout=2, headers=once)
                        break
                    except nats.errors.Error:  # no responders, a timeout: no leader yet
                        assert time.monotonic() < deadline, "no new leader"
                        await asyncio.sleep(0.2)
            info = await js.stream_info("R3")
            assert info.state.messages == 40 and info.cluster.leader != leader
        finally:
            await nc.close()

    asyncio.run(run())
    # a server with a wrong route password is refused by every member: no fourth peer
    intruder_env = _env(creds, "Wrong" + creds.admin_token, routes)
    intruder = _Member(tmp_path, 3, [*routes, free_port()], intruder_env)
    try:
        alive = [m for m in servers if m.proc.poll() is None]
        _wait(
            lambda: all('authentication error - User "route"' in m.log.read_text() for m in alive),
            "the intruder's routes were not refused",
        )
        for m in alive:
            names = {r.get("remote_name") for r in m.get("/routez").get("routes") or []}
            assert "nats-3" not in names, names
    finally:
        intruder.stop()
