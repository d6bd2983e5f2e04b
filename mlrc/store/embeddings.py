"""Stored test embeddings and the metrics re-scored from them (schema 8): the rows of
``mlrc_embedding_file`` and ``mlrc_rescored``. The first says which file holds a tested
reproduction's embeddings: its path relative to the study's folder and its sha256. The second holds
the values computed after the fact. Files are :mod:`mlrc.search.embeddings`'s; this module only
records and reads rows."""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

from sqlalchemy import select

from mlrc.store.engine import session, transact, upsert
from mlrc.store.records import EmbeddingFileRecord, from_row
from mlrc.store.schema import EmbeddingFile, Rescored, Study

if TYPE_CHECKING:
    from sqlalchemy.engine import Engine
    from sqlalchemy.orm import Session

__all__ = [
    "ALL_VS_ALL",
    "QUERY_GALLERY",
    "embedding_files",
    "files_of_studies",
    "record_rescored",
    "rescored_values",
    "retrieval_of",
    "retrieval_of_studies",
    "retest_hint",
    "write_embedding_file",
]

# How a test stage ranked its rows: each query against the gallery (a dataset with roles, as
# In-Shop's benchmark), or every test item against all the others (MLRC)
QUERY_GALLERY, ALL_VS_ALL = "query→gallery", "all vs all"


def retrieval_of(roles: Any) -> str:
    """:data:`QUERY_GALLERY` when the test rows' ``roles`` (``query``/``gallery``/``all``)
    name queries, else :data:`ALL_VS_ALL`."""
    return QUERY_GALLERY if any(str(r) == "query" for r in roles) else ALL_VS_ALL


def write_embedding_file(s: Session, study_id: int, reproduction: int, **fields: Any) -> None:
    """Upsert reproduction ``reproduction``'s embedding-file row inside session ``s`` (the
    transaction that stores its test results); ``fields``: params_hash, path, sha256, dtype,
    folds, n, dim, size, retrieval."""
    upsert(s, EmbeddingFile, {"study_id": study_id, "reproduction": reproduction}, **fields)


def embedding_files(engine: Engine, study_id: int) -> list[EmbeddingFileRecord]:
    """The study's embedding-file rows, by reproduction."""
    with session(engine) as s:
        q = select(EmbeddingFile).filter_by(study_id=study_id).order_by(EmbeddingFile.reproduction)
        return [from_row(EmbeddingFileRecord, r) for r in s.execute(q).scalars()]


def retrieval_of_studies(engine: Engine, study_ids: list[int]) -> dict[int, str]:
    """Per study id, how its test stage ranked: ``query→gallery`` when a stored reproduction
    did, else ``all vs all`` (every study tested before embeddings were stored was)."""
    with session(engine) as s:
        q = select(EmbeddingFile.study_id).where(
            EmbeddingFile.study_id.in_(study_ids), EmbeddingFile.retrieval == QUERY_GALLERY
        )
        ranked = set(s.execute(q.distinct()).scalars())
    return {i: QUERY_GALLERY if i in ranked else ALL_VS_ALL for i in study_ids}


def files_of_studies(engine: Engine, names: list[str]) -> dict[str, list[EmbeddingFileRecord]]:
    """Per study name (of ``names``; those without any are left out), its embedding files."""
    with session(engine) as s:
        q = (
            select(Study.name, EmbeddingFile)
            .join(EmbeddingFile, EmbeddingFile.study_id == Study.id)
            .where(Study.name.in_(names))
            .order_by(Study.name, EmbeddingFile.reproduction)
        )
        out: dict[str, list[EmbeddingFileRecord]] = {}
        for name, row in s.execute(q).all():
            out.setdefault(name, []).append(from_row(EmbeddingFileRecord, row))
        return out


def record_rescored(
    engine: Engine,
    study_id: int,
    reproduction: int,
    rows: list[tuple[str, int, dict[str, float]]],
    sha256: str,
    code_version: str,
) -> None:
    """Reproduction ``reproduction``'s re-scored values, ``(mode, fold, {metric key: value})``
    (fractions), computed from the embedding file with hash ``sha256``; one transaction."""

    def write(s: Session) -> None:
        for mode, fold, values in rows:
            for metric, value in values.items():
                key = {
                    "study_id": study_id,
                    "reproduction": reproduction,
                    "mode": mode,
                    "fold": fold,
                    "metric": metric,
                }
                upsert(
                    s, Rescored, key, value=float(value), sha256=sha256, code_version=code_version
                )

    transact(engine, write, f"recording re-scored metrics of reproduction {reproduction}")


def rescored_values(
    engine: Engine, study_ids: list[int], metrics: list[str]
) -> list[tuple[int, int, str, int, str, float]]:
    """The stored re-scored values of ``metrics`` for ``study_ids``: ``(study id, reproduction,
    mode, fold, metric, value)``, every fold (−1: the aggregate rows); only those computed from
    the reproduction's current embedding file (a reproduction tested again has a new one)."""
    with session(engine) as s:
        q = (
            select(
                Rescored.study_id,
                Rescored.reproduction,
                Rescored.mode,
                Rescored.fold,
                Rescored.metric,
                Rescored.value,
            )
            .join(
                EmbeddingFile,
                (EmbeddingFile.study_id == Rescored.study_id)
                & (EmbeddingFile.reproduction == Rescored.reproduction)
                & (EmbeddingFile.sha256 == Rescored.sha256),
            )
            .where(Rescored.study_id.in_(study_ids), Rescored.metric.in_(metrics))
        )
        return [tuple(r) for r in s.execute(q).all()]


def retest_hint(tested: list[int], with_file: list[int]) -> str:
    """What a study whose tested reproductions (``tested``) lack stored embeddings (all but
    ``with_file``) must run to have as many with embeddings: a new reproduction is tested (and
    stores its file) only above the last one tested, so ``N`` = the last + those without."""
    without = len([r for r in tested if r not in set(with_file)])
    n = max(tested, default=0) + without
    return f"no stored embeddings; run `study test --reproductions {n}` again"
