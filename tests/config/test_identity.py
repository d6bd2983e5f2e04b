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
