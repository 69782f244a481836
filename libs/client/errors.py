"""The command line's failures, by how ``mosaic`` reports them (``libs.client.cli.main``).

Their own module so every command module raises the same classes without importing the
entry point (which imports them all).
"""

from __future__ import annotations


class UsageProblem(Exception):
    """Bad input on the command line: one line, exit 2."""


class Refused(Exception):
    """The gateway refused the job: one line, exit 2."""


class Unavailable(Exception):
    """An optional part (the simulator) is not importable: one line, exit 1."""
