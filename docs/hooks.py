"""MkDocs hooks: make the CLI reference build from this environment, and never silently empty.

mkdocs-typer2 renders ``docs/reference/cli.md`` by running ``typer mlrc.cli utils docs`` in a
subprocess (typer's own generator; its in-process engine does not read typer 0.29's bundled
click). The ``typer`` it finds must be this interpreter's, so its folder goes first on PATH. If
that subprocess fails, the plugin inserts nothing and says nothing: the page is checked here for
every command of the Typer app, and a missing one is a warning (an error under ``--strict``).
"""

from __future__ import annotations

import logging
import os
import re
import sys

log = logging.getLogger("mkdocs.hooks.mlrc")


def on_config(config, **kwargs):
    bindir = os.path.dirname(sys.executable)
    os.environ["PATH"] = bindir + os.pathsep + os.environ.get("PATH", "")
    _keep_generated_html_literal()
    return config


def _keep_generated_html_literal() -> None:
    """The plugin inserts already-rendered HTML into the page's tree; Markdown would then parse
    its text again (``[OPTIONS] [name]`` in a usage line became a reference link). Mark that
    text atomic so it is shown as generated."""
    from markdown.util import AtomicString
    from mkdocs_typer2.markdown import TyperProcessor

    if getattr(TyperProcessor.run, "_mlrc_atomic", False):
        return
    original = TyperProcessor.run

    def run(self, parent, blocks):
        before = len(parent)
        result = original(self, parent, blocks)
        for element in list(parent)[before:]:
            for node in element.iter():
                if node.text:
                    node.text = AtomicString(node.text)
                if node.tail:
                    node.tail = AtomicString(node.tail)
        return result

    run._mlrc_atomic = True
    TyperProcessor.run = run


def _command_paths() -> list[str]:
    from mlrc.cli import command_paths

    return command_paths()


_SPHINX_ROLE = re.compile(r":(?:mod|func|class|meth|attr|data|obj|exc):(<code>)")


def on_page_content(html, page, **kwargs):
    if page.file.src_uri == "reference/api.md":
        # Docstrings are prose with a few Sphinx roles (:class:`X`); show them as plain code.
        return _SPHINX_ROLE.sub(r"\1", html)
    if page.file.src_uri != "reference/cli.md":
        return html
    missing = [p for p in _command_paths() if f"<code>{p}</code>" not in html]
    if missing:
        log.warning("reference/cli.md: the CLI reference lacks %s", ", ".join(missing))
    return html
