"""The words of the test-result tables' legend: the marks, and the notes a table may need
(baselines, pruning, protocols, trials scored 0, the traditional protocol's leakage). The notes a
table needs are picked by :func:`mlrc.report.layout.notes`; the renderers print them after the
table."""

from __future__ import annotations

from mlrc.errors import counted

__all__ = [
    "ARCHIVED",
    "ARCHIVED_NOTE",
    "BASELINE_NOTES",
    "BASELINE_NOTE_END",
    "DAGGER",
    "DDAGGER",
    "LEGEND",
    "LEGEND_ONE_MODEL",
    "NONFINITE_NOTE",
    "PROTOCOL_NOTE",
    "PRUNED_NOTE",
    "RESCORED_NOTE",
    "RETRIEVAL_NOTES",
    "pruning_label",
    "risk_text",
    "certified_text",
    "values_line",
    "SECTION",
    "TRADITIONAL_NOTE",
    "TRADITIONAL_TITLE",
    "UNTRAINED_NOTE",
    "WARM",
    "WARM_NOTE",
]

DAGGER = "†"
DDAGGER = "‡"
SECTION = "§"  # after the label of a study whose epoch was chosen on the test set
WARM = "¶"  # after the label of a study whose search was warm-started (search.warm_start)
LEGEND = [
    "Values in %: mean ± half-width of the 95% Student-t confidence interval over the n "
    "reproductions (separated: mean of a study's fold models; concatenated: their "
    "concatenation).",
    "Bold: best mean in its column within its block (the lowest for an error rate such as "
    "FNMR). "
    "Underlined: the block's best row (highest concatenated MAP@R).",
    f"{DAGGER} not significantly worse than the column's best at p ≥ 0.05 (Welch's t-test over "
    "reproductions); the best itself is not marked.",
    "Exact ties: every row tied for a column's best mean is bold and unmarked (every row tied "
    f"for the highest MAP@R underlined); another row gets {DAGGER} when no test against them "
    "gives p < 0.05.",
]


def values_line(sizes: tuple[int, int] | None) -> str:
    """The legend's first line, with the fold models' number and sizes when every block has
    the same (``sizes`` = (fold models, embedding size)); :data:`LEGEND`'s words otherwise."""
    if sizes is None:
        return LEGEND[0]
    k, d = sizes
    return (
        "Values in %: mean ± half-width of the 95% Student-t confidence interval over the n "
        f"reproductions (separated: mean of the {k} {d}-D fold models; concatenated: their "
        f"{k * d}-D concatenation)."
    )


# The marks when every block is traditional: one model per reproduction, no separated or
# concatenated modes to explain.
LEGEND_ONE_MODEL = [
    "Values in %: mean ± half-width of the 95% Student-t confidence interval over the n "
    "reproductions (one model each).",
    "Bold: best mean in its column within its block (the lowest for an error rate such as "
    "FNMR). "
    "Underlined: the block's best row (highest MAP@R).",
    LEGEND[2],
    LEGEND[3],
]
# How the test rows rank (mlrc.search.baseline.test_set_metrics): MAP@R, P@1, R-Precision,
# Recall@K; NMI, mAP@1000, ρ and π are computed on all the test rows either way
RETRIEVAL_NOTES = {
    "all vs all": "every test image is a query against all the other test images (MLRC)",
    "query→gallery": "each query image ranks the gallery images, as the dataset's benchmark "
    "does (a query's own image is never in the gallery); NMI, mAP@1000, ρ and π over all "
    "its test images",
}
PRUNED_NOTE = (
    f"{DDAGGER} searched with opt-in pruning (search.pruner) or in-fold stopping (search.stop): "
    "trials that could no longer win were stopped early, so the search is not the protocol's, "
    "which prunes nothing; each such study's rules and their risk measured by replay on the "
    "committed corpus follow."
)


def pruning_label(config: dict | None, settings: dict | None) -> str:
    """The study's pruning and stopping rules in words (``none`` without): as stored with its
    measured risk, else its pruner from the configuration (studies before #25)."""
    risk = (settings or {}).get("pruning_risk")
    if risk:
        return str(risk["rules"])
    pruner = (config or {}).get("pruner") or "none"
    startup = (config or {}).get("prune_startup", 5)
    return f"median(startup={startup})" if pruner == "median" else pruner


def risk_text(risk: dict | None) -> str:
    """The measured risk of a study's rules, one phrase ("" without pruning): the replay
    figures on the committed corpus (in-sample, and leave one study out where tuned)."""
    if not risk:
        return ""
    certified = certified_text(risk.get("certified"))
    if not risk.get("measured"):
        if (risk.get("certified") or {}).get("measured"):
            return certified
        return (
            "risk not measured on the corpus (measure it with `mlrc replay --corpus "
            "bench/corpus/FILE --pruner … --stop …`)"
        ) + (f"; {certified}" if certified else "")
    n, length = risk["studies"], risk.get("trials")
    text = (
        f"on the corpus ({counted(n, 'study')}{f', first {length} trials' if length else ''}): "
        f"{risk['fold_epochs_fraction']:.2f}× the fold-epochs, "
        f"the full protocol's choice pruned in {risk['choice_pruned']} of {n}, mean regret "
        f"{100 * risk['mean_regret']:.2f} MAP@R points"
    )
    loo = risk.get("leave_one_out")
    if loo:
        text += (
            f"; tuned leaving each study out: {loo['fold_epochs_fraction']:.2f}×, choice pruned "
            f"in {loo['choice_pruned']} of {n}, mean regret {100 * loo['mean_regret']:.2f} points"
        )
    if length and risk.get("study_trials", 0) > length:
        text += (
            f"; this search has {risk['study_trials']} trials, more than the corpus's "
            f"{length}: its risk is not measured at that length (on the corpus, rules tuned on "
            "shorter studies lost choices in longer ones)"
        )
    return text + (f"; {certified}" if certified else "")


def certified_text(c: dict | None) -> str:
    """The certified risk (``pruning_risk.certified``, :func:`mlrc.search.pruning.certified_risk`)
    in one phrase: within δ of the full protocol's best in how many corpus studies, with the
    one-sided 95 % lower bound, at what fraction of the fold-epochs; "" for a study stored
    before it existed."""
    if not c:
        return ""
    if not c["measured"]:
        return f"certified risk {c['why']}"
    deltas = ", ".join(f"{100 * d:.2f} points on {name}" for name, d in c["delta"].items())
    text = (
        f"certified on {counted(c['studies'], 'study')} ({c['preset']} preset, {c['folds']} "
        f"folds, first {c['trials']} trials; δ {deltas}): within δ of the full protocol's best "
        f"in {c['within']} of {c['studies']} (95 % lower bound {c['within_bounds'][0]:.2f}) "
        f"at {c['fold_epochs_fraction']:.2f}× the fold-epochs"
    )
    loso = c.get("leave_one_study_out")
    if loso:
        text += (
            f"; rules tuned leaving each study out: {loso['within']} of {loso['studies']} "
            f"(≥ {loso['within_bounds'][0]:.2f}) at {loso['fold_epochs_fraction']:.2f}×"
        )
    if c["study_trials"] > c["trials"]:
        text += f"; this search has {c['study_trials']} trials: longer ones are not certified"
    return text


WARM_NOTE = (
    f"{WARM} warm-started search (search.warm_start): its first trials were the best "
    "configurations of another study; not the reference's search, which starts from nothing."
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
ARCHIVED = "archived"  # after the study name of a row archived by study run --force-new
ARCHIVED_NOTE = (
    "archived: a study that `mlrc study run --force-new` replaced (renamed NAME.old-K) when its "
    "configuration changed; shown for reference, not part of the marks or tests. A report leaves "
    "it out once the current study NAME has test results (--archived shows it)."
)
UNTRAINED_NOTE = (
    "every test fold kept epoch 0, the untrained model (validation never improved on it): "
    "these are untrained numbers — the budget (preset.max_epochs, iterations_per_epoch) is too "
    "short to train"
)
RESCORED_NOTE = (
    "*: computed after the fact from stored embeddings (`mlrc study rescore`), not by the test "
    "stage that trained the models: the same intervals and marks, over the reproductions that "
    "stored their test embeddings (query→gallery where the test items have roles, else all vs "
    "all)."
)
