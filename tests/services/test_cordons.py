"""Cordons without a server: the shared label rule, the placer's ``Cordons`` set, the gateway's
nodes model and the body parser of the cordon routes (issue 13)."""

from __future__ import annotations

import msgspec
import pytest

from libs.policy.inventory import demo_cluster
from proto.cordons import Cordon, CordonRequest, is_cordoned, label_reason
from proto.nodes import NodeSpec
from services.gateway import nodes_view
from services.gateway.cordon_api import parse_request
from services.gateway.nodes_view import NodesModel
from services.placer.cordons import Cordons


def _node(node_id: str = "n1", **labels: str) -> NodeSpec:
    return msgspec.structs.replace(demo_cluster()[0], id=node_id, labels=labels)


@pytest.mark.parametrize(
    ("labels", "cordoned"),
    [
        ({}, False),
        ({"cordoned": "true"}, True),
        ({"mosaic/cordoned": " YES "}, True),
        ({"mosaic.cordoned": "1"}, True),
        ({"cordoned": "false"}, False),
        ({"cordoned": "0", "zone": "a"}, False),
        ({"drain": "true"}, False),
    ],
)
def test_one_label_rule_for_gateway_and_placer(labels: dict[str, str], cordoned: bool) -> None:
    spec = _node(**labels)
    assert is_cordoned(spec) is cordoned
    assert nodes_view.is_cordoned(spec) is cordoned  # the gateway re-exports the same rule
    assert (label_reason(spec) != "") is cordoned


def test_placer_set_is_records_union_labels_and_reports_changes() -> None:
    changes: list[int] = []
    c = Cordons(on_change=lambda: changes.append(1))
    plain, labelled = _node("a"), _node("b", cordoned="true")
    assert c.ids([plain, labelled]) == {"b"}
    c.put("a", Cordon(node="a", by="admin", reason="disk"))
    assert c.ids([plain, labelled]) == {"a", "b"}
    assert changes == [1]
    c.put("a", Cordon(node="a", by="admin", reason="disk, again"))  # no change to the set
    assert changes == [1]
    c.put("gone", Cordon(node="gone", by="admin"))  # a node not (yet) known is still listed
    assert c.ids([plain]) == {"a", "gone"}
    c.put("a", None)
    c.put("never-cordoned", None)
    assert c.ids([plain, labelled]) == {"b", "gone"}
    assert changes == [1, 1, 1]


def test_gateway_view_shows_record_or_label_cordon_with_the_reason() -> None:
    m = NodesModel()
    m.put_spec("a", _node("a"))
    m.put_spec("b", _node("b", **{"mosaic/cordoned": "true"}))
    m.put_spec("c", _node("c"))
    m.put_cordon("a", Cordon(node="a", by="admin", reason="bad fan", time=5.0))
    m.put_cordon("c", Cordon(node="c", by="admin"))
    views = {v.spec.id: v for v in m.views()}
    assert views["a"].cordoned and views["a"].cordon_reason == "bad fan"
    assert views["b"].cordoned and "mosaic/cordoned" in views["b"].cordon_reason
    assert views["c"].cordoned and views["c"].cordon_reason == "cordoned by admin"
    m.put_cordon("a", None)
    m.put_cordon("c", None)
    views = {v.spec.id: v for v in m.views()}
    assert not views["a"].cordoned and views["a"].cordon_reason == ""
    assert [k for k, v in views.items() if v.cordoned] == ["b"]


@pytest.mark.parametrize(
    ("body", "reason"),
    [(b"", ""), (b"  ", ""), (b"{}", ""), (b'{"reason": " bad fan "}', "bad fan")],
)
def test_cordon_body_is_optional(body: bytes, reason: str) -> None:
    assert parse_request(body) == CordonRequest(reason=reason)


@pytest.mark.parametrize(
    ("body", "fields"),
    [
        (b'{"reason": 3}', ["reason"]),
        (b'{"reason": "a\\nb"}', ["reason"]),
        (b'{"reason": "' + b"x" * 300 + b'"}', ["reason"]),
        (b'{"reason": "ok", "colour": "red"}', ["colour"]),
        (b'{"why": 1, "reason": null}', ["why", "reason"]),
        (b'["reason"]', ["body"]),
        (b"reason=maintenance", ["body"]),
        (b"{" * 5000, ["body"]),
    ],
)
def test_a_bad_cordon_body_names_the_field(body: bytes, fields: list[str]) -> None:
    got = parse_request(body)
    assert isinstance(got, list)
    assert [e.field for e in got] == fields
    assert all(e.reason for e in got)
