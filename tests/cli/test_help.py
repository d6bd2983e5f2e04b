"""``mlrc --help`` reads well: every command's help without Sphinx markup and with whole
sentences, in a terminal and in the generated CLI reference (``typer mlrc.cli utils docs``, what
mkdocs-typer2 renders into docs/reference/cli.md); :func:`mlrc.cli.help.help_text` against
hand-written expectations."""

from __future__ import annotations

import inspect
import re
import subprocess
import sys
from pathlib import Path

import pytest
import typer
from conftest import REPO, require
from typer.testing import CliRunner

from mlrc.cli import app
from mlrc.cli.gc import gc
from mlrc.cli.help import help_text
from mlrc.cli.report import report
from mlrc.cli.worker import worker

WIDE = {"COLUMNS": "500"}  # a terminal wide enough for any paragraph on one line
ANSI = re.compile(r"\x1b\[[0-9;]*m")
MARKUP = re.compile(r"``|:(?:py:)?(?:func|class|mod|meth|attr|data|obj|exc):`")


def command_words() -> list[list[str]]:
    """Every command and group of the app as the words typed after ``mlrc`` (``[]``: the root)."""
    found: list[list[str]] = []

    def walk(command, words: list[str]) -> None:
        found.append(words)
        for name, sub in sorted(getattr(command, "commands", {}).items()):
            walk(sub, [*words, name])

    walk(typer.main.get_command(app), [])
    return found


def shown_help(words: list[str]) -> str:
    result = CliRunner().invoke(app, [*words, "--help"], env=WIDE, prog_name="mlrc")
    assert result.exit_code == 0, result.output
    return ANSI.sub("", result.output)


def paragraphs(doc: str) -> list[str]:
    """The docstring's paragraphs, each with its whitespace collapsed to single spaces."""
    return [" ".join(p.split()) for p in re.split(r"\n\s*\n", doc)]


def on_one_line(text: str, output: str) -> bool:
    return any(text in line for line in output.splitlines())


@pytest.mark.parametrize("words", command_words(), ids=lambda w: " ".join(["mlrc", *w]))
def test_every_help_is_free_of_sphinx_markup(words):
    output = shown_help(words)
    assert "Usage: mlrc" in output
    assert not MARKUP.search(output), output


def test_a_wrapped_paragraph_reads_as_one_line():
    """``mlrc report``'s last paragraph and ``mlrc gc``'s first (in the root's list of commands)
    are wrapped in their docstrings; at a wide terminal each is one line."""
    last = paragraphs(inspect.getdoc(report))[-1]
    assert "\n" in inspect.getdoc(report).split("\n\n")[-1] and len(last) > 100
    assert on_one_line(last, shown_help(["report"])), last
    first = paragraphs(inspect.getdoc(gc))[0]
    assert "\n" in inspect.getdoc(gc).split("\n\n")[0]
    assert on_one_line(first, shown_help([])), first


def test_the_docstrings_stay_as_written_for_the_api_docs():
    assert "``--per-gpu N``" in worker.__doc__
    assert "`--per-gpu N` starts N such workers" in shown_help(["worker"])


def test_the_generated_cli_reference_reads_well():
    """The Markdown that mkdocs-typer2 renders into the CLI reference, from typer's generator."""
    exe = Path(sys.executable).with_name("typer")
    require(exe.exists(), "typer's command is not installed")
    done = subprocess.run(
        [str(exe), "mlrc.cli", "utils", "docs", "--name", "mlrc"],
        capture_output=True,
        text=True,
        cwd=REPO,
        timeout=120,
    )
    assert done.returncode == 0, done.stderr
    page = re.sub(r"^```.*?^```", "", done.stdout, flags=re.S | re.M)  # usage lines fenced
    assert "`mlrc report`" in page and "`mlrc study run`" in page
    assert not MARKUP.search(page), MARKUP.search(page)
    last = paragraphs(inspect.getdoc(report))[-1]
    assert on_one_line(last, page), last


# --- help_text -----------------------------------------------------------------------------------


def test_paragraphs_become_lines_and_blank_lines_stay():
    doc = """First sentence of the command,
    wrapped mid-sentence.

    A second paragraph,
    also wrapped.
    """
    assert help_text(doc) == (
        "First sentence of the command, wrapped mid-sentence.\n\nA second paragraph, also wrapped."
    )


def test_double_backticks_become_single_even_across_a_wrap():
    doc = "Write a study file: ``mlrc\nstudy test OUT`` re-runs it; ``--force`` overwrites."
    assert (
        help_text(doc)
        == "Write a study file: `mlrc study test OUT` re-runs it; `--force` overwrites."
    )


def test_sphinx_roles_become_their_names():
    doc = (
        "See :func:`mlrc.paths.logs_dir`, :class:`~mlrc.search.Context`, :mod:`mlrc.cli.data`, "
        ":meth:`Store.open`, :py:attr:`a.b.size`, :data:`DEFAULT_STORAGE`, :exc:`ValueError` "
        "and :func:`the folder <mlrc.paths.logs_dir>`."
    )
    assert help_text(doc) == (
        "See `logs_dir`, `Context`, `mlrc.cli.data`, `open`, `size`, `DEFAULT_STORAGE`, "
        "`ValueError` and `the folder`."
    )


def test_lists_and_indented_blocks_are_kept_as_written():
    doc = "Kinds:\n\n- losses\n- miners,\n  wrapped\n\nExample:\n\n    mlrc study run a.yaml\n    mlrc report"
    assert help_text(doc) == doc


def test_click_markers_are_respected():
    kept = "\bcolumn one\ncolumn two"
    assert help_text(f"Intro,\nwrapped.\n\n{kept}") == f"Intro, wrapped.\n\n{kept}"
    assert help_text("Shown,\nwrapped.\n\fNot shown,\n``left`` as is.") == (
        "Shown, wrapped.\fNot shown,\n``left`` as is."
    )


def test_help_text_of_help_text_is_the_same():
    doc = inspect.getdoc(worker) + "\n\nSee :func:`mlrc.cli.help.help_text`."
    once = help_text(doc)
    assert help_text(once) == once
    assert "``" not in once and ":func:" not in once
