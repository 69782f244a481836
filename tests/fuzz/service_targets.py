"""The targets of the service fuzzer: every subject and KV bucket a service of the stack
consumes, with the strategy of what is sent there and how it is published (a method of the
harness's ``Stack``, test_service_fuzz.py)."""

from __future__ import annotations

from collections.abc import Callable, Coroutine
from dataclasses import dataclass
from typing import Any

from hypothesis import strategies as st

from proto import subjects
from tests.fuzz import service_inputs as inp


def _or_garbage(s: st.SearchStrategy[Any]) -> st.SearchStrategy[Any]:
    return s | inp.garbage


@dataclass(frozen=True)
class Target:
    name: str
    strategy: st.SearchStrategy[Any]
    send: Callable[[Any, Any], Coroutine[Any, Any, None]]  # publishes one example
    # whether each batch must leave a trace (a refusal, a dead letter); False for an input
    # a service may overwrite or ignore without a word (none since the ranked queue went)
    noticed: bool = True


nodes_cmd = st.sampled_from(inp.REAL_NODES)
verbs = st.sampled_from(["run", "kill", "checkpoint"])
TARGETS = [
    Target("lifecycle", _or_garbage(inp.events), lambda s, x: s.lifecycle(x)),
    Target(
        "jobs.cancel",
        _or_garbage(inp.cancels),
        lambda s, x: s.durable(subjects.SUBJECT_CANCEL, x),
    ),
    Target(
        "node.<n>.*",
        st.tuples(nodes_cmd, verbs, _or_garbage(inp.commands)),
        lambda s, x: s.durable(subjects.node_command(x[0], x[1]), x[2]),
    ),
    Target(
        "telemetry.*",
        st.tuples(st.sampled_from(inp.REAL_NODES + inp.FAKE_NODES), _or_garbage(inp.samples)),
        lambda s, x: s.core(subjects.telemetry(x[0]), x[1]),
    ),
    Target(
        "executor.*",
        st.tuples(st.sampled_from(inp.FAKE_NODES), _or_garbage(inp.reports)),
        lambda s, x: s.core(subjects.executor_report(x[0]), x[1]),
    ),
    Target(
        "kv nodes",
        inp.node_specs | st.tuples(st.sampled_from(inp.FAKE_NODES), inp.garbage),
        lambda s, x: s.kv(subjects.KV_NODES, x[0], x[1]),
    ),
    Target(
        "kv ledger",
        st.tuples(st.sampled_from(inp.OTHER_IDS + inp.KV_KEYS), _or_garbage(inp.allocations)),
        lambda s, x: s.kv(subjects.KV_LEDGER, x[0], x[1]),
    ),
    Target(
        "intents.*",
        st.tuples(st.sampled_from(["defrag", "thermal"]), _or_garbage(inp.intents)),
        lambda s, x: s.durable(subjects.intents(x[0]), x[1]),
    ),
    Target(
        "kv tenants",
        st.tuples(st.sampled_from(inp.KV_KEYS), _or_garbage(inp.tenants)),
        lambda s, x: s.kv(subjects.KV_TENANTS, x[0], x[1]),
    ),
]
