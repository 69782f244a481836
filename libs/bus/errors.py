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


class PayloadTooLarge(BusError):
    """A publish refused before sending: data plus headers could exceed the server's max
    payload. Sent anyway, the server would answer ``-ERR 'Maximum Payload Violation'`` and drop
    the connection (with every subscription of the service on it)."""

    def __init__(self, subject: str, size: int, limit: int) -> None:
        super().__init__(
            f"message for {subject!r} is {size} bytes with headers; the server takes at most "
            f"{limit} (max_payload less a margin for headers)"
        )
        self.subject = subject
        self.size = size
        self.limit = limit
