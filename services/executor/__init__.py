"""Executor: runs the jobs the placer sends to its node(s) and reports their lifecycle."""
