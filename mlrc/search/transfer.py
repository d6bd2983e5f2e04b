"""A study as one compact file, and back into a store: how a long campaign survives a change of
machine without a dump of its growing store.

:func:`export_study` reads a study's mlrc rows (:func:`mlrc.store.transfer.study_rows`: trials,
fold runs with their validation curves, test results, baseline, campaign membership) and its
Optuna trials (parameters with their distributions, values, states, attributes);
:func:`write_study_file` writes them as gzip JSON (keys sorted, no timestamp in the gzip header:
the same study gives the same bytes). :func:`import_study` restores such a file into a store
that lacks the study: ``mlrc campaign run`` then finds its trials and reproductions done and
skips it, and ``mlrc report`` reads it as if it had run there. Checkpoints and stored test
embeddings are not carried.

The fold runs' curves hold everything :func:`mlrc.search.replay.recorded_study` reads: a store
restored from the files gives the pruning corpus too.
"""

from __future__ import annotations

import datetime as dt
import gzip
import json
from pathlib import Path
from typing import Any

import optuna
from optuna.distributions import distribution_to_json, json_to_distribution
from optuna.trial import FrozenTrial, TrialState

from mlrc import store
from mlrc.store.transfer import restore_study_rows, study_rows

__all__ = ["FORMAT", "export_study", "import_study", "read_study_file", "write_study_file"]

FORMAT = "mlrc-study-file/1"


def _time(t: dt.datetime | None) -> str | None:
    return t.isoformat() if t is not None else None


def _trial_doc(t: FrozenTrial) -> dict[str, Any]:
    """An Optuna trial as plain data (numbers and ids are implied by the order)."""
    return {
        "number": t.number,
        "state": t.state.name,
        "value": t.value if t.state == TrialState.COMPLETE else None,
        "params": t.params,
        "distributions": {k: distribution_to_json(d) for k, d in t.distributions.items()},
        "user_attrs": t.user_attrs,
        "system_attrs": t.system_attrs,
        "intermediate_values": {str(k): v for k, v in t.intermediate_values.items()},
        "datetime_start": _time(t.datetime_start),
        "datetime_complete": _time(t.datetime_complete),
    }


def export_study(url: str, name: str) -> dict[str, Any]:
    """Study ``name`` of the store at ``url`` as plain data (see the module). Export a study
    once it is done. One still running is carried as a killed process leaves it (its running
    trial RUNNING), which the next run recovers as interrupted and retries with the same
    parameters, its fold from scratch (no ``last.pt`` travels); the tests cover finished and
    grown studies, not this. A study registered but never searched has no Optuna study:
    ``optuna`` is None then."""
    engine = store.connect(url)
    rows = study_rows(engine, name)
    try:
        ostudy = optuna.load_study(study_name=name, storage=store.optuna_storage(url))
    except KeyError:  # Optuna's "Record does not exist."
        return {"format": FORMAT, "name": name, "rows": rows, "optuna": None}
    trials = ostudy.get_trials(deepcopy=False)
    return {
        "format": FORMAT,
        "name": name,
        "rows": rows,
        "optuna": {"user_attrs": ostudy.user_attrs, "trials": [_trial_doc(t) for t in trials]},
    }


def _frozen(doc: dict[str, Any]) -> FrozenTrial:
    """The Optuna trial of :func:`_trial_doc`'s dict, to add to a study."""
    state = TrialState[doc["state"]]
    stamp = {k: doc[k] and dt.datetime.fromisoformat(doc[k]) for k in ("datetime_start",
             "datetime_complete")}  # fmt: skip
    return FrozenTrial(
        number=doc["number"],
        state=state,
        value=doc["value"],
        params=doc["params"],
        distributions={k: json_to_distribution(d) for k, d in doc["distributions"].items()},
        user_attrs=doc["user_attrs"],
        system_attrs=doc["system_attrs"],
        intermediate_values={int(k): v for k, v in doc["intermediate_values"].items()},
        trial_id=0,  # assigned by the storage
        **stamp,
    )


def import_study(url: str, doc: dict[str, Any]) -> None:
    """Restore :func:`export_study`'s ``doc`` into the store at ``url`` (created if need be),
    Optuna's study first, then mlrc's rows; a :class:`~mlrc.store.StoreError` when the store
    has either already (nothing is written then)."""
    if doc.get("format") != FORMAT:
        raise store.StoreError(f"study file format {doc.get('format')!r}: expected {FORMAT!r}")
    name = doc["name"]
    engine = store.connect(url)
    if store.studies.study_named(engine, name) is not None:
        raise store.StoreError(f"study {name!r} already exists in the store: not restored")
    if doc["optuna"] is None:  # never searched: mlrc's rows only
        restore_study_rows(engine, doc["rows"])
        return
    storage = store.optuna_storage(url)
    try:
        ostudy = optuna.create_study(study_name=name, storage=storage, direction="maximize")
    except optuna.exceptions.DuplicatedStudyError:
        raise store.StoreError(
            f"an Optuna study {name!r} exists in the store: not restored"
        ) from None
    try:
        for key, value in doc["optuna"]["user_attrs"].items():
            ostudy.set_user_attr(key, value)
        ostudy.add_trials([_frozen(t) for t in doc["optuna"]["trials"]])
        restore_study_rows(engine, doc["rows"])
    except BaseException:
        optuna.delete_study(study_name=name, storage=storage)  # all or nothing
        raise


def write_study_file(doc: dict[str, Any], path: Path) -> bool:
    """Write ``doc`` to ``path`` as gzip JSON, the same bytes for the same study; returns
    whether the file changed."""
    text = json.dumps(doc, sort_keys=True, separators=(",", ":"), allow_nan=True)
    data = gzip.compress(text.encode(), compresslevel=9, mtime=0)
    if path.exists() and path.read_bytes() == data:
        return False
    path.parent.mkdir(parents=True, exist_ok=True)
    tmp = path.with_name(path.name + ".tmp")
    tmp.write_bytes(data)
    tmp.replace(path)
    return True


def read_study_file(path: Path) -> dict[str, Any]:
    """A file written by :func:`write_study_file`."""
    return json.loads(gzip.decompress(path.read_bytes()))
