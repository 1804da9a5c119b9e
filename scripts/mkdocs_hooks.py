"""MkDocs hooks (mkdocs.yml ``hooks:``): fill the reference pages' generated parts.

``<!-- gator:settings -->`` becomes the settings table of django_gator/conf/table.py and
``<!-- gator:checks -->`` the system checks listed in django_gator/checks.py's docstring,
``<!-- gator:commands -->`` every management command's usage and options, read from its
argparse parser (scripts/docs_reference.py). The markers ``<!-- runnable -->`` and
``<!-- fragment -->`` before code blocks are for tests/test_docs_examples.py and vanish in
the HTML, as every HTML comment does.
"""

from __future__ import annotations

import logging
import re
import sys
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parent.parent
if str(ROOT) not in sys.path:
    sys.path.insert(0, str(ROOT))

from scripts import docs_reference  # noqa: E402

MARKERS = {
    "<!-- gator:settings -->": docs_reference.settings_markdown,
    "<!-- gator:checks -->": docs_reference.checks_markdown,
    "<!-- gator:commands -->": docs_reference.commands_markdown,
}

#: Markdown that reached the HTML unrendered (a broken link or emphasis, a fence, a marker
#: left unfilled), looked for outside code; each is a warning, which fails a strict build.
UNRENDERED = re.compile(r"\]\(|\*\*|```|<!-- gator:")
CODE = re.compile(r"<(pre|code|script)\b.*?</\1>", re.DOTALL)
log = logging.getLogger("mkdocs.plugins.gator")

#: A Sphinx role in a docstring (``:class:`~django_gator.x.Y```), as mkdocstrings leaves it.
SPHINX_ROLE = re.compile(r":(?:class|func|mod|meth|data|attr|exc):<code>~?([\w.]+)</code>")


def on_config(config: Any) -> Any:
    docs_reference.setup_django()
    return config


def on_page_markdown(markdown: str, page: Any, config: Any, files: Any) -> str:
    for marker, generate in MARKERS.items():
        if marker in markdown:
            markdown = markdown.replace(marker, generate())
    return markdown


def on_page_content(html: str, page: Any, config: Any, files: Any) -> str:
    """Show a docstring's Sphinx cross-reference as the code name it refers to, and warn
    about Markdown left unrendered."""
    html = SPHINX_ROLE.sub(lambda m: f"<code>{m.group(1)}</code>", html)
    for problem in unrendered(html):
        log.warning("Doc file '%s' has unrendered Markdown: %s", page.file.src_path, problem)
    return html


def unrendered(html: str) -> list[str]:
    """The Markdown syntax, with some context, that the HTML shows outside code."""
    text = CODE.sub("", html)
    return [repr(text[max(0, m.start() - 40) : m.end() + 40]) for m in UNRENDERED.finditer(text)]
