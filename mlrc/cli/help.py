"""Command help that reads well: the docstrings of the commands, shown as whole sentences in a
terminal and in the generated CLI reference. They are written for the API docs (Sphinx roles, code
in double backticks, lines wrapped at 100 columns).

:func:`help_text` turns one docstring into help text; :func:`readable_help` applies it to every
command and group of a Typer app once they are registered. The docstrings themselves stay as they
are for the API docs.
"""

from __future__ import annotations

import inspect
import re

import typer
from typer.main import solve_typer_info_help
from typer.models import TyperInfo

__all__ = ["help_text", "readable_help"]

_ROLE = re.compile(
    r":(?:py:)?(?P<role>mod|func|class|meth|attr|data|obj|exc|const):`(?P<text>[^`]+)`"
)
_TITLED = re.compile(r"(?P<title>.+?)\s*<[^<>]+>$")  # :func:`the title <mlrc.x.y>`
_LITERAL = re.compile(r"``(?P<code>[^`]+?)``")
_KEPT_LINE = re.compile(r"^(\s|[-*•+] |\d+[.)] |\x08)")  # indented, a list item, click's \b


def help_text(doc: str) -> str:
    """``doc`` (a docstring or a ``help=`` string) as help text.

    Dedented; each paragraph (text between blank lines) made one line, except a paragraph with
    an indented line, a list item or click's backspace marker, kept as written. Code in double
    backticks gets single ones (Markdown's code in the generated reference); a Sphinx role
    becomes its target in single backticks: a module's full name, else the last dotted name
    (``c`` for ``a.b.c``, ``~`` dropped) or the explicit title (``title <a.b.c>``). What follows
    click's form feed (the part help leaves out) is kept as it is. Idempotent."""
    shown, cut, rest = inspect.cleandoc(doc).partition("\f")
    paragraphs = re.split(r"\n[ \t]*\n", shown.strip("\n"))
    text = "\n\n".join(_unwrapped(p) for p in paragraphs)
    text = _ROLE.sub(_role, text)
    return _LITERAL.sub(r"`\g<code>`", text) + cut + rest


def _unwrapped(paragraph: str) -> str:
    """One line of the paragraph's words, unless a line of it is indented, a list item or
    ``\\b`` (then as written)."""
    lines = paragraph.split("\n")
    if any(_KEPT_LINE.match(line) for line in lines):
        return paragraph
    return " ".join(line.strip() for line in lines)


def _role(match: re.Match[str]) -> str:
    """One Sphinx role in single backticks: its title, its module, or its last dotted name."""
    text = match["text"]
    titled = _TITLED.match(text)
    if titled:
        return f"`{titled['title']}`"
    target = text.lstrip("~!.")
    name = target if match["role"] == "mod" else target.rsplit(".", 1)[-1]
    return f"`{name}`"


def readable_help(app: typer.Typer) -> None:
    """Give ``app``, every command and every group under it (recursively) the
    :func:`help_text` of the help Typer would show (an explicit ``help=``, else the docstring).
    Changes the app's registrations in place, so ``--help`` and ``typer … utils docs`` (the
    generated CLI reference) both show it; call it once every command is registered."""
    own = solve_typer_info_help(TyperInfo(app))
    if own:
        app.info.help = help_text(own)
    for command in app.registered_commands:
        doc = command.help if command.help is not None else inspect.getdoc(command.callback)
        if doc:
            command.help = help_text(doc)
    for group in app.registered_groups:
        doc = solve_typer_info_help(group)
        if doc:
            group.help = help_text(doc)
        if group.typer_instance is not None:
            readable_help(group.typer_instance)
