"""The heavy test files that `make test` starts first (tests/conftest.py's HEAVY_FIRST)."""

from __future__ import annotations

from conftest import HEAVY_FIRST, TESTS


def test_every_heavy_file_exists_once():
    assert len(set(HEAVY_FIRST)) == len(HEAVY_FIRST)
    missing = [name for name in HEAVY_FIRST if not (TESTS / name).is_file()]
    assert not missing, f"tests/conftest.py HEAVY_FIRST names files that are gone: {missing}"


def test_the_heavy_files_are_collected_first(request):
    """Those of them in this run (all in `make test`; some in a partial run) lead, in order."""
    files = list(dict.fromkeys(str(item.path) for item in request.session.items))
    heavy = [str(TESTS / name) for name in HEAVY_FIRST if str(TESTS / name) in files]
    assert files[: len(heavy)] == heavy
