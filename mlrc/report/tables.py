"""Test-result tables with 95% confidence intervals, read from the store only.

Layout of the mean-field paper's Table 7: per dataset a block, one row per study (its loss, and
its strategy as "contrastive + metrix"), columns separated (mean of the four 128-D fold models)
and concatenated (512-D) × MAP@R, P@1, R-Precision, in percent, as "mean ± half-width of the 95%
Student-t interval over reproductions", with the number of reproductions ``n``.

Rows: the studies of the selected campaigns in campaign order (``mlrc_campaign_study.position``),
then the selected ``--study`` names (or, with no selection, every study) by name. Dataset blocks
follow the order in which their first row appears.

Protocols: a comparison is only fair within one protocol (:func:`comparison_scope`: everything in the
study's resolved configuration that defines its numbers except the loss, miner, strategy, batch
sampler, their parameters and the budgets). A dataset whose studies ran under several protocols
gets one block per protocol (in the order of their first row), headed by the protocol's short
hash (:func:`comparison_key`) and the fields in which it differs from the dataset's other protocols
(``preset.max_epochs 1``); the legend names them (``preset.max_epochs 1 vs 2``). A dataset with a
single protocol looks as if there were no protocols. Studies of one protocol whose search budgets
differ (``trials``) share a block, with a note naming the budgets.

Baseline row: the first row(s) of a block are the untrained models of its studies
(``mlrc_baseline`` through ``mlrc_study_baseline``): "Pretrained (trunk)", the ImageNet trunk on
the test classes, or "Random init (trunk)" for presets that train their trunk from scratch. One
evaluation: ``n`` = 1, no interval, no marks, not part of any comparison. A study without a
baseline in the store (stores written before baselines were computed) adds none.

Marks, within one block (a block with a single study row has nothing to compare and gets none):

* **bold** — the best mean in its column (the highest; the lowest for an error rate such as FNMR); exact ties are all bold.
* underline — the block's best row: the highest concatenated (512-D) MAP@R, the reality check's
  headline number (separated MAP@R when no row has a concatenated result); exact ties are all
  underlined. Only the row label is underlined, so it does not collide with the bold cells.
* † — not significantly worse than the column's best row: Welch's two-sided t-test
  (``scipy.stats.ttest_ind(equal_var=False)``) of the row's per-reproduction values against those
  of the column's best row gives p ≥ 0.05. The best itself is never marked; with fewer than
  two reproductions on either side p is NaN and there is no mark.
* exact ties — every row whose mean equals the column's best is the best: bold, never †, no
  p-value; another row is tested against each of them and keeps the smallest p.

Archived studies: a study that ``study run --force-new`` replaced is renamed ``NAME.old-K``. Its
row is labelled "loss (NAME.old-K, archived)", takes no part in the marks or tests, and the
legend says what it is; the CSV/JSON ``archived`` column flags it. By default it is left out once
the current study ``NAME`` has test results (``archived=True`` keeps it, and so does naming it).

Untrained test models: when every test fold of a study kept epoch 0 (the untrained model, as
with very short budgets), the notes say so for its row; the CSV/JSON ``untrained_test`` column
flags it.

Trials scored 0: a search trial whose loss or embeddings went non-finite is complete with value 0
(as in the reference harness), its reason starting with ``store.NONFINITE``. The legend counts
them per study ("contrastive (cub200): 3 of 50 complete trials scored 0 — …"), the CSV in
``nonfinite_trials`` (of ``complete_trials``).

Traditional protocol (``preset.split_scheme: traditional``, :func:`is_traditional`): one model
trained on all training classes, its epoch chosen on the test classes — test-set selection, a
leakage. Its block (always its own) shows that one model's Recall@K (the papers' K of the
dataset), MAP@R and chosen epoch (not in %, never marked); its rows carry § and the legend a note.
The CSV's ``test_set_selection`` column (present when a study has it) flags its lines.

Formats: ``md`` (GitHub markdown; underline as ``<ins>``, which GitHub renders, it drops ``<u>``),
``csv`` (tidy: one line per row × mode × metric with protocol, protocol_fields, mean, half_width,
n, low, high, best, best_row, p_value, not_worse, complete_trials, nonfinite_trials; a baseline
line has ``loss`` = its kind, ``pretrained`` or ``random_init``, and ``study`` = its label),
``latex`` (booktabs, ``\\pm``, ``\\textbf``, ``\\underline``, ``$^{\\dagger}$``;
``standalone=True`` wraps it in a document that pdflatex compiles) and ``html`` (one
self-contained page, ``<strong>``, ``<u>``, ``<sup>†</sup>``, no external resources). Every format
but CSV ends with the legend of ± and the marks, and the notes above.

The parts: :mod:`mlrc.report.values` (the selection and :func:`collect`, reading the store
through :mod:`mlrc.store.reads`), :mod:`mlrc.report.scopes`, :mod:`mlrc.report.summary`
(intervals and marks), :mod:`mlrc.report.layout` (blocks, rows, cells, notes),
:mod:`mlrc.report.legend` (its words) and the formats (:mod:`mlrc.report.formats`,
:mod:`mlrc.report.latex`, :mod:`mlrc.report.table_html`). This module gathers their public names.
"""

from mlrc.report.formats import FORMATS, render
from mlrc.report.latex import latex_escape
from mlrc.report.layout import BASELINE_KINDS, METRIC_LABELS, MODE_LABELS, row_label
from mlrc.report.legend import (
    ARCHIVED,
    ARCHIVED_NOTE,
    BASELINE_NOTE_END,
    BASELINE_NOTES,
    DAGGER,
    DDAGGER,
    LEGEND,
    NONFINITE_NOTE,
    PROTOCOL_NOTE,
    PRUNED_NOTE,
    SECTION,
    TRADITIONAL_NOTE,
    TRADITIONAL_TITLE,
    UNTRAINED_NOTE,
    WARM,
    WARM_NOTE,
)
from mlrc.report.scopes import (
    COMPARISON_EXCLUDED,
    MAX_SHOWN_FIELDS,
    comparison_key,
    comparison_scope,
    scope_differences,
)
from mlrc.report.summary import ALPHA, TIDY_COLUMNS, summarize, welch_p, with_defaults
from mlrc.report.values import (
    META_COLUMNS,
    MODES,
    VALUE_COLUMNS,
    ReportError,
    collect,
    is_nonfinite,
    is_traditional,
    select_studies,
)

__all__ = [
    "ARCHIVED",
    "ARCHIVED_NOTE",
    "ALPHA",
    "BASELINE_KINDS",
    "BASELINE_NOTES",
    "BASELINE_NOTE_END",
    "DAGGER",
    "DDAGGER",
    "FORMATS",
    "LEGEND",
    "MAX_SHOWN_FIELDS",
    "META_COLUMNS",
    "METRIC_LABELS",
    "MODES",
    "MODE_LABELS",
    "NONFINITE_NOTE",
    "COMPARISON_EXCLUDED",
    "PROTOCOL_NOTE",
    "PRUNED_NOTE",
    "SECTION",
    "TIDY_COLUMNS",
    "TRADITIONAL_NOTE",
    "TRADITIONAL_TITLE",
    "UNTRAINED_NOTE",
    "VALUE_COLUMNS",
    "WARM",
    "WARM_NOTE",
    "ReportError",
    "collect",
    "is_nonfinite",
    "is_traditional",
    "latex_escape",
    "scope_differences",
    "comparison_key",
    "comparison_scope",
    "render",
    "row_label",
    "select_studies",
    "summarize",
    "welch_p",
    "with_defaults",
]
