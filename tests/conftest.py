"""Shared fixtures. Parts absent on a laptop skip with a reason; in CI they must exist."""

from __future__ import annotations

import os
from pathlib import Path

import pytest

REPO = Path(__file__).resolve().parents[1]
OMNIGLOT_DEFAULT = REPO.parent / "shared" / "datasets" / "omniglot" / "images_background_small1.zip"


def require(part_available: bool, why: str) -> None:
    """Skip (laptop) or fail (CI, MLRC_REQUIRE_ALL=1) when a real part the test needs is absent."""
    if part_available:
        return
    if os.environ.get("MLRC_REQUIRE_ALL") == "1":
        pytest.fail(f"required in CI but missing: {why}")
    pytest.skip(why)


@pytest.fixture(scope="session")
def omniglot_zip() -> Path:
    path = Path(os.environ.get("MLRC_OMNIGLOT_ZIP", OMNIGLOT_DEFAULT))
    require(path.is_file(), f"the real Omniglot subset is not at {path} (set MLRC_OMNIGLOT_ZIP)")
    return path
