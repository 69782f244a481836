"""Cordons: "place nothing new on this node", as the operator said it or as a node label says it.

Why a record of its own (KV ``cordons``, one key per node) and not a node label: a node's spec
is written by that node's telemetry service (rule 2: one writer per fact), so an operator who
edits a label races the agent that republishes the spec. The gateway alone writes this bucket
(``POST /v1/nodes/{id}/cordon``), the placer and the gateway read it; uncordon deletes the key.
Labels (``CORDON_LABELS``) still cordon too: a node can be shipped cordoned by its own agent's
configuration. Both definitions live here so the gateway and the placer (which never import one
another) agree on what "cordoned" means. A cordon stops new placements only; jobs already
running there keep running (Kubernetes' cordon, not drain).
"""

from __future__ import annotations

import msgspec

from proto.nodes import NodeSpec

# A node is cordoned when one of these labels says so (any of the _TRUE spellings)
CORDON_LABELS = ("cordoned", "mosaic/cordoned", "mosaic.cordoned")
_TRUE = {"1", "true", "yes", "on"}
MAX_REASON_CHARS = 256  # a reason is one line an operator reads in a table


def is_cordoned(spec: NodeSpec) -> bool:
    """Does a label of ``spec`` cordon the node?"""
    return any(spec.labels.get(k, "").strip().lower() in _TRUE for k in CORDON_LABELS)


def label_reason(spec: NodeSpec) -> str:
    """What a view shows as the reason of a label cordon: the label that says so."""
    for k in CORDON_LABELS:
        if spec.labels.get(k, "").strip().lower() in _TRUE:
            return f"label {k}={spec.labels[k]}"
    return ""


class Cordon(msgspec.Struct, frozen=True, kw_only=True):
    """KV ``cordons``/<node>: who cordoned the node, why and when (Mosaic clock)."""

    node: str
    by: str  # the API principal: "admin" (or a tenant name, should tenants ever be allowed)
    reason: str = ""
    time: float = 0.0


class CordonRequest(msgspec.Struct, frozen=True, kw_only=True, forbid_unknown_fields=True):
    """The optional body of ``POST /v1/nodes/{id}/cordon``."""

    reason: str = ""


class CordonState(msgspec.Struct, frozen=True, kw_only=True):
    """The answer to cordon and uncordon: whether the node is cordoned now, and by what.

    ``label`` True: a node label cordons it, which uncordon through the API does not lift (the
    label is its agent's to change), so ``cordoned`` can stay True after an uncordon."""

    node: str
    cordoned: bool
    label: bool = False
    by: str = ""
    reason: str = ""
    time: float | None = None
