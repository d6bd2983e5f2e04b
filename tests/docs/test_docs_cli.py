"""The commands page and the Typer app cannot drift: every option that docs/reference/commands.md
shows on a command exists on that command, and every option of every command of ``mlrc.cli``
is shown there (with its command).

The page is read as a user reads it: each code span that starts with ``mlrc`` names a command
(the longest run of words that is one of the app's commands: ``mlrc study run FILE …`` is
``study run``; ``mlrc --debug COMMAND`` is the root) and the ``--options`` written in it. The
app is walked through click (``typer.main.get_command``), hidden commands and options left out."""

from __future__ import annotations

import re

import pytest
import typer
from conftest import REPO

from mlrc.cli import app

PAGE = REPO / "docs" / "reference" / "commands.md"
FENCE = re.compile(r"^(```|~~~).*?^\1", re.S | re.M)
SPAN = re.compile(r"`([^`\n]+)`")
OPTION = re.compile(r"(?<![\w-])--[a-z][a-z0-9-]*")


def app_options() -> dict[str, list[set[str]]]:
    """Each visible command as typed (``mlrc study run``; ``mlrc`` for the root's own options)
    with its visible options, each as the set of its long spellings (a flag's ``--x`` and
    ``--no-x`` are one option)."""
    out: dict[str, list[set[str]]] = {}

    def walk(command, path: str) -> None:
        out[path] = [
            {o for o in [*p.opts, *p.secondary_opts] if o.startswith("--")}
            for p in command.params
            if p.param_type_name == "option" and not getattr(p, "hidden", False)
        ]
        for name, sub in sorted(getattr(command, "commands", {}).items()):
            if not getattr(sub, "hidden", False):
                walk(sub, f"{path} {name}")

    walk(typer.main.get_command(app), "mlrc")
    return out


def names(options: list[set[str]]) -> set[str]:
    return set().union(*options)


def documented(text: str, commands: set[str]) -> dict[str, set[str]]:
    """The options the page shows per command: every code span that starts with ``mlrc``, its
    command the longest run of words that is a command of the app."""
    out: dict[str, set[str]] = {}
    for span in SPAN.findall(FENCE.sub("", text)):
        words = span.replace("\\|", "|").split()
        if not words or words[0] != "mlrc":
            continue
        path = "mlrc"
        for word in words[1:]:
            if f"{path} {word}" not in commands:
                break
            path = f"{path} {word}"
        out.setdefault(path, set()).update(OPTION.findall(span))
    return out


def test_the_parser_reads_the_pages_usage_lines():
    commands = {"mlrc", "mlrc study", "mlrc study run", "mlrc data", "mlrc data summary"}
    text = (
        "| `mlrc study run FILE [--storage URL --keep resume\\|best]` / `mlrc data summary "
        "NAME [--scheme mlrc\\|kfold]` | x |\n`mlrc --debug COMMAND`, `--threads N` alone\n"
        "```bash\nmlrc study run x.yaml --not-read\n```\n`mlrc study FILE --folds`"
    )
    assert documented(text, commands) == {
        "mlrc study run": {"--storage", "--keep"},
        "mlrc data summary": {"--scheme"},
        "mlrc": {"--debug"},
        "mlrc study": {"--folds"},
    }


def test_the_app_is_walked_to_every_option():
    options = app_options()
    assert {"--fold-parallel", "--no-fold-parallel"} in options["mlrc study run"]
    assert {"--storage", "--trials"} <= names(options["mlrc study run"])
    assert options["mlrc"] == [{"--version"}, {"--debug"}] and options["mlrc data list"] == []


@pytest.fixture(scope="module")
def page() -> dict[str, set[str]]:
    return documented(PAGE.read_text(encoding="utf-8"), set(app_options()))


def test_every_documented_option_exists_on_its_command(page):
    options = {cmd: names(opts) for cmd, opts in app_options().items()}
    wrong = {cmd: sorted(opts - options[cmd]) for cmd, opts in page.items() if opts - options[cmd]}
    assert not wrong, f"{PAGE.relative_to(REPO)} shows options these commands do not have: {wrong}"


def test_every_option_of_every_command_is_documented(page):
    missing = {}
    for cmd, options in app_options().items():
        shown = page.get(cmd, set())
        lacking = [sorted(o)[0] for o in options if not o & shown]
        if lacking:
            missing[cmd] = lacking
    assert not missing, (
        f"{PAGE.relative_to(REPO)} does not show these options (add them to the command's "
        f"line, described from its --help): {missing}"
    )
