"""mlrc.config.identity: the one "same numbers?" comparison of study run, campaign run and
--force-new, checked on hand-written fingerprints."""

from __future__ import annotations

from mlrc.config import identity_change
from mlrc.config.identity import canonical_json, first_difference, identity


def fingerprint(**preset) -> dict:
    return {
        "trials": 50,
        "reproductions": 10,
        "study": {"name": "s", "search": {"trials": 50}, "test": {"reproductions": 10}},
        "preset": {"trunk": "bninception", "search": {"trials": 50}, "test": {"reproductions": 10},
                   **preset},
    }  # fmt: skip


def test_budgets_are_not_identity():
    grown = fingerprint()
    grown["trials"] = grown["study"]["search"]["trials"] = 80
    grown["reproductions"] = 3
    assert identity_change(fingerprint(), grown) is None
    assert "trials" not in identity(grown) and "trials" not in identity(grown)["study"]["search"]


def test_a_changed_field_is_named_with_both_values():
    change = identity_change(fingerprint(lr=1e-6), fingerprint(lr=1e-5))
    assert change == "preset.lr: 1e-06 in the store, 1e-05 now"
    assert identity_change(fingerprint(), fingerprint(amp="bf16")) == (
        "preset.amp: None in the store, 'bf16' now"
    )


def test_values_compare_as_canonical_json():
    """1 and 1.0 are different numbers in a stored configuration; key order is not a change."""
    assert identity_change(fingerprint(x=1), fingerprint(x=1.0)) is not None
    a, b = fingerprint(x=1, y=2), fingerprint(y=2, x=1)
    assert canonical_json(a) == canonical_json(b) and identity_change(a, b) is None
    assert first_difference({"a": {"b": 1}}, {"a": {"b": 2}}) == "a.b: 1 in the store, 2 now"


def test_the_global_batch_is_identity_the_processes_sharing_it_only_with_random_crops():
    """A study at batch 648 is not the one at 32. The same global batch on 1, 2 or 4 processes
    per trial is the same study without random augmentation (issue #24); with random crops or
    flips each rank draws its own, so K ≠ 1 is another study (#37, finding 3), with its own
    artifact key; K = 1 leaves the fingerprint as before. Read from real resolved
    fingerprints."""
    from mlrc.config import StudyConfig, resolve
    from mlrc.config.identity import artifact_key

    fixed = {"image": {"resize": 36, "crop": 32, "scale": [1.0, 1.0], "ratio": [1.0, 1.0],
                       "flip": False}}  # fmt: skip

    def fp(**over) -> dict:
        doc = {"name": "s", "dataset": {"name": "glyphs"}, "preset": "cpu",
               "loss": {"name": "contrastive"}, "overrides": over}  # fmt: skip
        return resolve(StudyConfig.model_validate(doc), "s").fingerprint()

    assert identity_change(fp(**fixed), fp(**fixed, processes_per_trial=2)) is None
    assert (
        identity_change(fp(**fixed, processes_per_trial=2), fp(**fixed, processes_per_trial=4))
        is None
    )
    assert "processes_per_trial" not in identity(fp(**fixed, processes_per_trial=4))["preset"]
    assert "processes_per_trial" not in fp(processes_per_trial=1)["preset"]  # as before
    assert identity_change(fp(), fp(processes_per_trial=1)) is None
    change = identity_change(fp(), fp(processes_per_trial=2))
    assert change is not None and "processes_per_trial" in change
    assert identity_change(fp(processes_per_trial=2), fp(processes_per_trial=4)) is not None
    assert artifact_key(fp()) != artifact_key(fp(processes_per_trial=2))
    assert artifact_key(fp(**fixed)) == artifact_key(fp(**fixed, processes_per_trial=2))
    change = identity_change(fp(), fp(batch={"size": 64}))
    assert change is not None and change.startswith("preset.batch.size: 32 in the store, 64 now")


def test_a_warm_start_is_identity_like_enqueue_but_not_protocol():
    """``search.warm_start`` decides which parameters are tried, as ``search.enqueue``: another
    one is another study; unset, it is left out (a study stored before it still matches). Like
    enqueue it is no part of the report's protocol (its rows are marked instead)."""
    from mlrc.config import StudyConfig, resolve
    from mlrc.report.scopes import comparison_key

    def fp(**search) -> dict:
        doc = {"name": "s", "dataset": {"name": "glyphs"}, "preset": "cpu",
               "loss": {"name": "contrastive"}, "search": {"trials": 2, **search}}  # fmt: skip
        return resolve(StudyConfig.model_validate(doc), "s").fingerprint()

    plain, warm = fp(), fp(warm_start={"study": "cub", "top": 3})
    assert "warm_start" not in plain["study"]["search"]
    assert "warm_start" not in plain["preset"]["search"]
    assert warm["study"]["search"]["warm_start"] == {"study": "cub", "file": None, "top": 3}
    assert identity_change(plain, warm) == (
        "study.search.warm_start: None in the store, {'study': 'cub', 'file': None, 'top': 3} now"
    )
    assert identity_change(warm, fp(warm_start={"study": "cub", "top": 4})) is not None
    enqueued = fp(enqueue=[{"pos_margin": 0.1}])
    assert identity_change(plain, enqueued) is not None  # the rule it follows
    assert comparison_key(plain) == comparison_key(warm) == comparison_key(enqueued)


def test_the_fold_slack_of_search_stop_is_identity_and_zero_is_the_rule_before_it():
    """``search.stop.fold_slack`` (#25, tuned on the 50-trial corpus) changes which folds stop:
    a study stored before it (its stop rule without the field) matches a file that sets it to
    0 — the rule it ran — and not one that takes the new default."""
    from mlrc.config import StudyConfig, resolve

    def fp(**stop) -> dict:
        doc = {"name": "s", "dataset": {"name": "glyphs"}, "preset": "cpu",
               "loss": {"name": "contrastive"}, "search": {"trials": 2, "stop": stop}}  # fmt: skip
        return resolve(StudyConfig.model_validate(doc), "s").fingerprint()

    new = fp()
    assert new["stop"]["fold_slack"] == 0.04  # the default
    before = fp(fold_slack=0.0)
    assert "fold_slack" not in before["stop"]  # as a study stored before the field
    assert "fold_slack" not in before["study"]["search"]["stop"]
    stored = {**new, "stop": {k: v for k, v in new["stop"].items() if k != "fold_slack"}}
    stored["study"] = {**new["study"], "search": {**new["study"]["search"]}}
    stored["study"]["search"]["stop"] = dict(stored["stop"])
    assert identity_change(stored, before) is None
    assert identity_change(stored, new) is not None
