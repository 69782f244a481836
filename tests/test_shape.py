"""The shape issue 13 set for ``libs/policy``, kept: every module under 400 lines, every
function under 120, and no import beyond the standard library, ``proto``, numpy and numba
(file parsing, timing and I/O live outside: ``libs/policy_io``, ``libs/sim``)."""

from __future__ import annotations

import ast
import sys
from pathlib import Path

POLICY = Path(__file__).resolve().parent.parent / "libs" / "policy"
ALLOWED_ROOTS = {"proto", "numpy", "numba", "libs"}
MAX_MODULE_LINES, MAX_FUNCTION_LINES = 400, 120


def _modules() -> list[Path]:
    return sorted(POLICY.rglob("*.py"))


def test_every_module_and_function_of_the_policy_is_small() -> None:
    too_long: list[str] = []
    for path in _modules():
        text = path.read_text()
        lines = text.count("\n")
        if lines > MAX_MODULE_LINES:
            too_long.append(f"{path.relative_to(POLICY)}: {lines} lines")
        for node in ast.walk(ast.parse(text)):
            if isinstance(node, ast.FunctionDef | ast.AsyncFunctionDef):
                n = node.end_lineno - node.lineno + 1  # type: ignore[operator]
                if n > MAX_FUNCTION_LINES:
                    too_long.append(f"{path.relative_to(POLICY)}:{node.lineno} {node.name}: {n}")
    assert too_long == []


def test_the_policy_imports_only_the_standard_library_proto_numpy_and_numba() -> None:
    stdlib = set(sys.stdlib_module_names)
    foreign: list[str] = []
    for path in _modules():
        for node in ast.walk(ast.parse(path.read_text())):
            names: list[str] = []
            if isinstance(node, ast.Import):
                names = [a.name for a in node.names]
            elif isinstance(node, ast.ImportFrom) and node.level == 0 and node.module:
                names = [node.module]
            for name in names:
                root = name.split(".")[0]
                outside = root == "libs" and not name.startswith("libs.policy")
                unknown = root not in stdlib | ALLOWED_ROOTS | {"__future__"}
                if outside or unknown:
                    foreign.append(f"{path.relative_to(POLICY)}: {name}")
    assert foreign == []
