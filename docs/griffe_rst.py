"""A griffe extension for the API reference: the docstrings' reST roles as Markdown.

warcore's docstrings are written to read well in ``help()`` and in an editor, with reST
cross-reference roles (``:class:`~warcore.StepSpec```) and literal blocks introduced by ``::``.
mkdocstrings renders Markdown, so this turns each role into a cross-reference that links where
the object has a page in the site and stays plain code where it has none (an *optional*
reference: it never fails the strict build), and a trailing ``::`` into ``:``. The docstrings
themselves are not changed.
"""

from __future__ import annotations

import re
from typing import Any

import griffe

ROLE = re.compile(r":(?:class|func|meth|attr|data|mod|exc|obj):`(~?)([^`<]+?)(?:\s*<([^>]+)>)?`")


def _reference(match: re.Match[str]) -> str:
    short, text, target = match.groups()
    identifier = (target or text).strip().lstrip("~.")
    title = identifier.rsplit(".", 1)[-1] if short and not target else text.strip()
    return f'<autoref identifier="{identifier}" optional><code>{title}</code></autoref>'


def markdown(text: str) -> str:
    text = ROLE.sub(_reference, text)
    return re.sub(r"(?m)(\S)::$", r"\1:", text)


class RstRoles(griffe.Extension):
    def on_instance(self, *, obj: griffe.Object, **kwargs: Any) -> None:
        if obj.docstring is not None:
            obj.docstring.value = markdown(obj.docstring.value)
