"""mkdocs hooks: pages built from Markdown files that live outside ``docs/``.

``BENCHMARKS.md`` and ``plugins/sglang/README.md`` are written to be read in the repository
(and the README is warcore-sglang's package description), so they stay where they are and the
site carries a copy of each, built on every ``mkdocs build``. Their links are resolved as in the
repository: a link to another included file points at its page, an image is copied into the site
beside the page, a link to any other file of the repository (source, a folder, the root README)
keeps its text and loses the link (it has no page in the site), and a link to a file that does
not exist is a warning, so ``mkdocs build --strict`` fails on it as on any broken link.

A file that is not in the checkout (the sglang README is written on another branch) gets a page
that says so instead, so the navigation and the links to it stay valid.

The API reference pages render each public package's ``__all__``. A name that mkdocstrings
cannot see (griffe reads the source without importing it: a name a lazy ``__getattr__`` exports
and no ``if TYPE_CHECKING:`` import names) would silently be left out; a warning for each name
of ``__all__`` missing from its page makes the strict build fail instead.

The hook specifications are found by what they are, not by name: the class of ``warcore.core``
whose methods are marked ``@hookspec``, in whichever of its modules it lives, so the Hooks page
follows it when the core is reorganised.
"""

from __future__ import annotations

import ast
import logging
import posixpath
import re
from pathlib import Path
from typing import Any

from mkdocs.structure.files import File, Files

log = logging.getLogger("mkdocs.hooks.include")

ROOT = Path(__file__).resolve().parent.parent
INCLUDED = {
    "BENCHMARKS.md": "benchmark-results.md",
    "plugins/sglang/README.md": "warcore-sglang.md",
}
"""Repository path of each included file -> its page in the site."""
API_PAGES = {
    "api/index.md": "warcore",
    "api/core.md": "warcore.core",
    "api/attention.md": "warcore.attention",
    "api/batch.md": "warcore.batch",
    "api/runners.md": "warcore.runners",
    "api/testing.md": "warcore.testing",
}
"""API reference page -> the package whose ``__all__`` it must show in full."""
HOOKSPECS_PAGE = "api/hooks.md"
HOOKSPECS_MARK = "::: hookspecs"
"""On the Hooks page, stands for ``::: <the hookspec class>``, found in ``warcore/core``."""
IMAGES = (".png", ".svg", ".jpg", ".jpeg", ".gif")
LINK = re.compile(r"(!?)\[([^\]]*)\]\(([^)\s]+)\)")


def on_files(files: Files, config: Any) -> Files:
    for source, page in INCLUDED.items():
        path = ROOT / source
        if path.is_file():
            text = _relink(source, page, path.read_text(encoding="utf-8"), files, config)
        else:
            text = (
                f"# {source}\n\n`{source}` is not in this checkout yet: once it is, this page "
                "is built from it.\n"
            )
        files.append(File.generated(config, page, content=text))
    return files


def _relink(source: str, page: str, text: str, files: Files, config: Any) -> str:
    here = posixpath.dirname(source)

    def target_of(match: re.Match[str]) -> str:
        image, label, target = match.groups()
        if re.match(r"[a-z]+:|#", target):
            return match.group(0)
        path, _, fragment = target.partition("#")
        resolved = posixpath.normpath(posixpath.join(here, path))
        fragment = f"#{fragment}" if fragment else ""
        if resolved in INCLUDED:
            return f"{image}[{label}]({_relative(INCLUDED[resolved], page)}{fragment})"
        if not (ROOT / resolved).exists():
            log.warning("%s links to %s, which does not exist", source, target)
            return match.group(0)
        if image and resolved.endswith(IMAGES):
            if files.get_file_from_path(resolved) is None:
                files.append(File.generated(config, resolved, abs_src_path=str(ROOT / resolved)))
            return f"{image}[{label}]({_relative(resolved, page)})"
        return label  # a file of the repository with no page in the site

    return LINK.sub(target_of, text)


def _relative(target: str, page: str) -> str:
    return posixpath.relpath(target, posixpath.dirname(page) or ".")


def on_page_markdown(markdown: str, page: Any, **kwargs: Any) -> str:
    if page.file.src_uri != HOOKSPECS_PAGE:
        return markdown
    found = _hookspec_classes(ROOT / "warcore" / "core")
    if len(found) != 1:
        log.warning(
            "%s: want one class of @hookspec methods in warcore/core, found %s",
            page.file.src_uri,
            found,
        )
        return markdown
    return markdown.replace(HOOKSPECS_MARK, f"::: {found[0]}")


def _hookspec_classes(package: Path) -> list[str]:
    """Dotted paths of the classes in ``package`` with a method decorated ``@hookspec``."""
    found = []
    for path in sorted(package.rglob("*.py")):
        for node in ast.parse(path.read_text(encoding="utf-8")).body:
            if isinstance(node, ast.ClassDef) and any(
                _is_hookspec(decorator)
                for method in node.body
                if isinstance(method, ast.FunctionDef)
                for decorator in method.decorator_list
            ):
                module = ".".join(path.relative_to(ROOT).with_suffix("").parts)
                found.append(f"{module.removesuffix('.__init__')}.{node.name}")
    return found


def _is_hookspec(decorator: ast.expr) -> bool:
    target = decorator.func if isinstance(decorator, ast.Call) else decorator
    name = target.attr if isinstance(target, ast.Attribute) else getattr(target, "id", "")
    return name == "hookspec"


def on_page_content(html: str, page: Any, **kwargs: Any) -> str:
    module = API_PAGES.get(page.file.src_uri)
    if module is not None:
        missing = [name for name in _exported(module) if f'id="{module}.{name}"' not in html]
        if missing:
            log.warning(
                "%s: %s exports %s, which the API reference cannot see (a lazy export? import it "
                "under `if TYPE_CHECKING:` too)",
                page.file.src_uri,
                module,
                ", ".join(missing),
            )
    return html


def _exported(module: str) -> list[str]:
    """``module.__all__``, read from its source (no import: the docs build imports nothing)."""
    path = ROOT.joinpath(*module.split("."))
    source = path / "__init__.py" if path.is_dir() else path.with_suffix(".py")
    for node in ast.parse(source.read_text(encoding="utf-8")).body:
        if isinstance(node, ast.Assign) and any(
            isinstance(target, ast.Name) and target.id == "__all__" for target in node.targets
        ):
            return [str(name) for name in ast.literal_eval(node.value)]
    log.warning("%s has no literal __all__ for its API reference page", module)
    return []
