"""Each frozen record holds exactly its table's columns (read from the ORM classes), so a column
a later schema adds cannot be dropped silently on its way out of the store; and a record built
from a row reads the row's values and cannot be written back."""

from __future__ import annotations

import dataclasses

import pytest
from sqlalchemy import inspect

from mlrc.store.records import (
    BaselineRecord,
    FoldRunRecord,
    HistoryRecord,
    StudyRecord,
    TestResultRecord,
    TrialRecord,
    from_row,
)
from mlrc.store.schema import Baseline, FoldRun, Study, StudyHistory, TestResult, Trial

PAIRS = [
    (StudyRecord, Study),
    (TrialRecord, Trial),
    (FoldRunRecord, FoldRun),
    (TestResultRecord, TestResult),
    (BaselineRecord, Baseline),
    (HistoryRecord, StudyHistory),
]


@pytest.mark.parametrize("record, table", PAIRS, ids=lambda x: x.__name__)
def test_a_record_has_its_tables_columns(record, table):
    columns = {c.key for c in inspect(table).column_attrs}
    assert {f.name for f in dataclasses.fields(record)} == columns


def test_a_record_reads_a_row_and_is_frozen():
    row = Trial(id=7, study_id=1, number=3, state="complete", params={"m": 0.5})
    rec = from_row(TrialRecord, row)
    assert (rec.id, rec.number, rec.state, rec.params) == (7, 3, "complete", {"m": 0.5})
    with pytest.raises(dataclasses.FrozenInstanceError):
        rec.state = "failed"
