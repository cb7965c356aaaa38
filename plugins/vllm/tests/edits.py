"""Edits of a vLLM function's syntax tree, for :func:`warcore_vllm.audit._variants.variant`: each
takes one guard out of the real code (or puts one in)."""

from __future__ import annotations

import ast
from collections.abc import Callable

__all__ = ["drop_statements", "duplicate_statements", "insert_after"]

Edit = Callable[[ast.FunctionDef], None]


def _bodies(text: str, rewrite: Callable[[list[ast.stmt]], list[ast.stmt]]) -> Edit:
    class Rewrite(ast.NodeTransformer):
        def generic_visit(self, node: ast.AST) -> ast.AST:
            super().generic_visit(node)
            for field in ("body", "orelse", "finalbody"):
                stmts = getattr(node, field, None)
                if isinstance(stmts, list) and stmts:
                    setattr(node, field, rewrite(stmts) or [ast.Pass()])
            return node

    def change(node: ast.FunctionDef) -> None:
        Rewrite().visit(node)

    return change


def drop_statements(text: str) -> Edit:
    """Remove every statement whose source contains ``text``."""
    return _bodies(text, lambda stmts: [s for s in stmts if text not in ast.unparse(s)])


def duplicate_statements(text: str) -> Edit:
    """Run every simple statement whose source contains ``text`` twice."""

    def twice(stmts: list[ast.stmt]) -> list[ast.stmt]:
        out: list[ast.stmt] = []
        for s in stmts:
            out.append(s)
            if isinstance(s, ast.Expr) and text in ast.unparse(s):
                out.append(s)
        return out

    return _bodies(text, twice)


def insert_after(text: str, code: str) -> Edit:
    """Put ``code`` after every simple statement whose source contains ``text``."""

    def after(stmts: list[ast.stmt]) -> list[ast.stmt]:
        out: list[ast.stmt] = []
        for s in stmts:
            out.append(s)
            if isinstance(s, ast.Expr | ast.Assign) and text in ast.unparse(s):
                out.extend(ast.parse(code).body)
        return out

    return _bodies(text, after)
