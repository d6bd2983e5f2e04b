"""Download-once-with-checksum, exercised with local file:// URLs (no network in tests)."""

from __future__ import annotations

import shutil

import pytest

from mlrc import data
from mlrc.data import download
from mlrc.data.base import DatasetError


def test_omniglot_is_fetched_once_checked_and_cached(tmp_path, monkeypatch, omniglot_zip):
    source = tmp_path / "mirror" / "images_background_small1.zip"
    source.parent.mkdir()
    shutil.copy(omniglot_zip, source)
    monkeypatch.setenv("MLRC_CACHE", str(tmp_path / "cache"))
    monkeypatch.setenv("MLRC_OMNIGLOT_URL", source.as_uri())
    ds = data.build("omniglot")  # no root: download into the cache
    cached = tmp_path / "cache" / "omniglot" / "images_background_small1.zip"
    assert cached.is_file() and download.sha256(cached) == download.OMNIGLOT_SHA256
    assert ds.num_classes == 136
    source.unlink()  # a second build must not need the source any more
    assert data.build("omniglot").num_classes == 136


def test_checksum_mismatch_leaves_nothing_in_the_cache(tmp_path, monkeypatch):
    monkeypatch.setenv("MLRC_CACHE", str(tmp_path / "cache"))
    bogus = tmp_path / "bogus.zip"
    bogus.write_bytes(b"not the omniglot archive")
    with pytest.raises(DatasetError, match="SHA-256 mismatch"):
        download.fetch_omniglot(bogus.as_uri())
    assert not any((tmp_path / "cache").rglob("*.zip*"))


def test_corrupted_cache_entry_is_fetched_again(tmp_path, monkeypatch, omniglot_zip):
    monkeypatch.setenv("MLRC_CACHE", str(tmp_path / "cache"))
    cached = tmp_path / "cache" / "omniglot" / "images_background_small1.zip"
    cached.parent.mkdir(parents=True)
    cached.write_bytes(b"half a download")
    assert download.fetch_omniglot(omniglot_zip.as_uri()) == cached
    assert download.sha256(cached) == download.OMNIGLOT_SHA256


def test_unreachable_source_is_a_clear_error(tmp_path, monkeypatch):
    monkeypatch.setenv("MLRC_CACHE", str(tmp_path / "cache"))
    with pytest.raises(DatasetError, match="download failed"):
        download.fetch_omniglot((tmp_path / "absent.zip").as_uri())
