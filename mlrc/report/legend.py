"""The words of the test-result tables' legend: the marks, and the notes a table may need
(baselines, pruning, protocols, trials scored 0, the traditional protocol's leakage). :func:`mlrc.report.layout.notes` picks the
notes a table needs; the renderers print them after the table."""

from __future__ import annotations

__all__ = [
    "BASELINE_NOTES",
    "BASELINE_NOTE_END",
    "DAGGER",
    "DDAGGER",
    "LEGEND",
    "LEGEND_ONE_MODEL",
    "NONFINITE_NOTE",
    "PROTOCOL_NOTE",
    "PRUNED_NOTE",
    "SECTION",
    "TRADITIONAL_NOTE",
    "TRADITIONAL_TITLE",
]

DAGGER = "†"
DDAGGER = "‡"
SECTION = "§"  # after the label of a study whose epoch was chosen on the test set
LEGEND = [
    "Values in %: mean ± half-width of the 95% Student-t confidence interval over the n "
    "reproductions (separated: mean of the four 128-D fold models; concatenated: their 512-D "
    "concatenation).",
    "Bold: best mean in its column within its block. "
    "Underlined: the block's best row (highest concatenated MAP@R).",
    f"{DAGGER} not significantly worse than the column's best at p ≥ 0.05 (Welch's t-test over "
    "reproductions); the best row itself is not marked.",
]
# The marks when every block is traditional: one model per reproduction, no separated or
# concatenated modes to explain.
LEGEND_ONE_MODEL = [
    "Values in %: mean ± half-width of the 95% Student-t confidence interval over the n "
    "reproductions (one model each).",
    "Bold: best mean in its column within its block. "
    "Underlined: the block's best row (highest MAP@R).",
    LEGEND[2],
]
PRUNED_NOTE = (
    f"{DDAGGER} searched with opt-in median pruning (search.pruner): trials below the median "
    "after a fold were stopped early; the protocol's search prunes nothing."
)
BASELINE_NOTES = {
    "pretrained": "Pretrained: the ImageNet-pretrained trunk, untrained, on the test classes",
    "random_init": "Random init: the randomly initialised trunk (the preset trains it from "
    "scratch), untrained, on the test classes",
}
BASELINE_NOTE_END = (
    "; one evaluation (n = 1, no interval), the same features in both modes, not part of the "
    "marks or tests."
)
PROTOCOL_NOTE = (
    "Protocol (short hash): everything in a study's resolved configuration that defines its "
    "numbers except the loss, miner, strategy, batch sampler, their parameters and the budgets. "
    "A dataset with several protocols gets one block per protocol; marks and Welch tests "
    "compare rows within a block only."
)
NONFINITE_NOTE = "scored 0 — non-finite loss or embeddings, as in the reference harness"
TRADITIONAL_TITLE = "traditional protocol: epoch chosen on the test set"
TRADITIONAL_NOTE = (
    f"{SECTION} traditional protocol (the seed papers' own tables): one model trained on all "
    "training classes, its epoch chosen on the test classes — test-set selection, a leakage; "
    "not comparable with the reality-check rows. Its block shows that one model (512-D in the "
    "preset): Recall@K and MAP@R in %, and the chosen epoch (mean ± 95% half-width in epochs, "
    "never marked)."
)
