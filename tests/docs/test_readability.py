"""scripts/readability.py: the sentence splitter on tricky prose (abbreviations, numbers, code
spans, list items), what it leaves out (code, tables, headings, markers, HTML, front matter),
and ``--check`` on the repository's pages, which must pass and can fail."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

import pytest
from conftest import REPO

sys.path.insert(0, str(REPO / "scripts"))
try:
    import readability
finally:
    sys.path.remove(str(REPO / "scripts"))


def split(text: str) -> list[str]:
    return [s for b in readability.blocks(text) for s in readability.sentences(b)]


def words(text: str) -> list[int]:
    return [readability.count_words(s) for s in split(text)]


@pytest.mark.parametrize(
    ("text", "expected"),
    [
        ("One two three. Four five.", [3, 2]),
        ("Use a margin, e.g. 0.5 or i.e. Half of it. Next one.", [10, 2]),
        ("A learning rate of 1e-5 and 0.5 dropout. Then 3.14 works.", [8, 3]),
        ("Compare with the papers (Musgrave et al. 2020). Fine.", [8, 1]),
        ("See Fig. 3 and vs. Other. End here!", [6, 2]),
        ("Is it? Yes. No!", [2, 1, 1]),
        ("Run `mlrc study run x.yaml. Then more` now. Done.", [3, 1]),
        ("The ratio is 0.5. 10 folds follow.", [4, 3]),
        ("J. S. Bach wrote it. Then stop.", [5, 2]),
        ("It ends without a stop", [5]),
    ],
)
def test_the_splitter(text, expected):
    assert words(text) == expected


def test_list_items_and_paragraphs_end_sentences():
    text = "Intro line\n\n- first item without a stop\n- second item. And more\n\nA paragraph\nwrapped here."
    assert words(text) == [2, 5, 2, 2, 4]


def test_what_is_left_out():
    text = """---
title: front matter words here
---
# A heading with words

Prose one.

```bash
echo fenced code. Not prose.
```

    indented code. Not prose.

| a table | row. Not prose. |
|---|---|

!!! note "An admonition title"
    Body is prose.

<details>
<summary>Summary</summary>
</details>

<!-- a comment. Not prose. -->

A [linked text](http://x.y/z.w) <b>bold</b> end.

[ref]: http://example.com/a.b
"""
    assert split(text) == ["Prose one.", "Body is prose.", "A linked text bold end."]


def test_indented_text_under_a_list_item_is_prose():
    text = "- item one.\n\n    continued paragraph. Two sentences.\n"
    assert words(text) == [2, 2, 2]


def test_figures_and_limits(tmp_path: Path):
    page = tmp_path / "p.md"
    page.write_text("Short one. " * 19 + " ".join(["Word"] * 40) + ".\n")
    f = readability.measure(page)
    assert (f.sentences, f.words, f.long, f.longest) == (20, 78, 1, 40)
    assert f.mean == pytest.approx(78 / 20)
    assert readability.failures(f) == []  # 5 % over 35 words is allowed
    page.write_text("Short one. " * 9 + " ".join(["Word"] * 40) + ".\n")
    assert readability.failures(readability.measure(page)) == [
        "10.0 % of sentences over 35 words > 5 %"
    ]
    page.write_text(" ".join(["word"] * 19) + ".\n")
    assert readability.failures(readability.measure(page)) == ["mean sentence 19.0 words > 18"]


def test_every_user_page_is_checked_or_listed_as_not_yet():
    listed = readability.CHECKED + readability.NOT_YET
    assert len(set(listed)) == len(listed), "a page is listed twice"
    pages = [REPO / "README.md", *(REPO / "docs").glob("*.md"), *(REPO / "docs/guide").glob("*.md")]
    unlisted = [str(p.relative_to(REPO)) for p in pages if str(p.relative_to(REPO)) not in listed]
    assert not unlisted, f"add to scripts/readability.py's CHECKED or NOT_YET: {unlisted}"
    assert all((REPO / p).is_file() for p in readability.CHECKED)


def test_the_check_passes_on_the_repository():
    run = subprocess.run(
        [sys.executable, str(REPO / "scripts/readability.py"), "--check"],
        capture_output=True,
        text=True,
    )
    assert run.returncode == 0, run.stdout + run.stderr


def test_the_check_fails_on_a_long_page(monkeypatch, tmp_path, capsys):
    page = tmp_path / "long.md"
    page.write_text(" ".join(["word"] * 40) + ".\n")
    monkeypatch.setattr(readability, "REPO", tmp_path)
    monkeypatch.setattr(readability, "CHECKED", ["long.md"])
    assert readability.main(["--check"]) == 1
    assert "long.md: mean sentence 40.0 words > 18" in capsys.readouterr().err
