"""Errors the bus raises, so callers need not know nats-py's exception zoo."""

from __future__ import annotations


class BusError(RuntimeError):
    """Base class of every bus error."""


class BusUnavailable(BusError):
    """The NATS server could not be reached (after every retry)."""


class KeyExists(BusError):
    """``TypedKV.create`` on a key that already has a value."""


class CasConflict(BusError):
    """``TypedKV.update`` with a revision that is no longer the latest: someone else wrote first."""
