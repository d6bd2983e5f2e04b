"""The report's table blocks: the studies of one dataset under one protocol, with the fields in
which a dataset's blocks differ. A block's protocol is its resolved configuration without what a
table compares (:mod:`mlrc.report.scopes`), and how its test stage ranked: query→gallery or all vs
all."""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import TYPE_CHECKING

from mlrc.config.presets import is_traditional
from mlrc.report.scopes import (
    comparison_key,
    comparison_scope,
    diff_text,
    fields_text,
    scope_differences,
)
from mlrc.store.embeddings import ALL_VS_ALL

if TYPE_CHECKING:
    from mlrc.store import StudyRecord

__all__ = ["Group", "scope_groups", "word_differences"]


@dataclass
class Group:
    """The studies of one dataset under one protocol: a table block."""

    dataset: str
    key: str
    protocol: dict
    studies: list[StudyRecord] = field(default_factory=list)
    fields: str = ""  # this protocol's differing fields, "" when the dataset has one protocol
    diff: str = ""  # the dataset's differing fields, "" when it has one protocol
    rank: tuple[int, int] = (0, 0)  # (dataset, protocol within the dataset) in table order
    retrieval: str = ALL_VS_ALL  # how its test stage ranked: query→gallery or all vs all

    @property
    def traditional(self) -> bool:
        """The protocol chooses the epoch on the test classes (:func:`is_traditional`)."""
        return is_traditional(self.protocol)


def scope_groups(
    ordered: list[StudyRecord], retrieval: dict[int, str] | None = None
) -> list[Group]:
    """Per dataset, per protocol, a group of the studies (given in table order); datasets and
    their protocols in the order of their first study, with their differing fields worded. The
    fields are compared among the traditional protocols and among the others apart: a
    traditional block is always a block of its own and leaves the others' headers as they were.
    A study whose test stage ranked query→gallery (``retrieval``, by study id) is compared with
    ``retrieval: query→gallery`` added to its protocol, so it never shares a block with one
    ranked all vs all."""
    by_dataset: dict[str, dict[str, Group]] = {}
    for st in ordered:
        groups = by_dataset.setdefault(st.dataset, {})
        how = (retrieval or {}).get(st.id, ALL_VS_ALL)
        config = st.config if how == ALL_VS_ALL else {**(st.config or {}), "retrieval": how}
        key = comparison_key(config)
        group = Group(st.dataset, key, comparison_scope(config), retrieval=how)
        groups.setdefault(key, group).studies.append(st)
    out = []
    for d_rank, groups in enumerate(by_dataset.values()):
        for g_rank, g in enumerate(groups.values()):
            g.rank = (d_rank, g_rank)
            out.append(g)
        for traditional in (False, True):
            word_differences([g for g in groups.values() if g.traditional == traditional])
    return out


def word_differences(groups: list[Group]) -> None:
    """Sets (in place) the differing fields of a dataset's ``groups`` when there are several."""
    if len(groups) < 2:
        return
    diffs = scope_differences([g.protocol for g in groups])
    for i, g in enumerate(groups):
        g.fields = fields_text(diffs, i)
        g.diff = diff_text(diffs)


# --- rows ---------------------------------------------------------------------------------------
