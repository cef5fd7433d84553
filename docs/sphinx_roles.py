"""A Griffe extension for the API reference: docstrings' Sphinx roles rendered as code.

unihub's docstrings name other objects the Sphinx way (``:class:`~unihub.readers.reader.Reader```,
``:func:`make_reader```), which Markdown would show as literal text. Each role becomes a code span of what
Sphinx would print: the target, its last component where it starts with ``~``, or the title of
``Title <target>``. Used by mkdocs.yml (``extensions: [docs/sphinx_roles.py]``).
"""

from __future__ import annotations

import re
from typing import Any

import griffe

ROLE = re.compile(r":(?:py:)?(?:mod|class|func|meth|attr|data|exc|obj|const|term|ref):`([^`]+)`")


def _shown(target: str) -> str:
    """What Sphinx prints for a role's target."""
    titled = re.fullmatch(r"(.+?)\s*<[^>]+>", target)
    if titled:
        return titled.group(1)
    if target.startswith("~"):
        return target[1:].rsplit(".", 1)[-1]
    return target.lstrip("!")


def render_roles(text: str) -> str:
    """``text`` with every Sphinx role replaced by a Markdown code span."""
    return ROLE.sub(lambda match: f"`{_shown(match.group(1))}`", text)


class SphinxRoles(griffe.Extension):
    """Rewrites each loaded object's docstring once, before mkdocstrings renders it."""

    def on_instance(self, *, node: Any, obj: griffe.Object, agent: Any, **kwargs: Any) -> None:
        if obj.docstring is not None:
            obj.docstring.value = render_roles(obj.docstring.value)
