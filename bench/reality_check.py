"""The cpu-reality-check campaign's files in the repository (issue #41).

    .venv/bin/python bench/reality_check.py export --storage URL [--all] [--out DIR]
    .venv/bin/python bench/reality_check.py import --storage URL [--files DIR]
    .venv/bin/python bench/reality_check.py check --storage URL [--corpus FILE]
    .venv/bin/python bench/reality_check.py corpus --storage URL [--out FILE]
    .venv/bin/python bench/reality_check.py certify [--corpus FILE] [--jobs N]

``export`` writes one compact file per finished study of the campaign
(``studies/campaigns/cpu-reality-check/<study>.json.gz``, :mod:`mlrc.search.transfer`: its trials,
fold runs with their validation curves, test results and baseline; no checkpoints), rewriting
a file only when the study changed; ``--all`` exports unfinished studies too (not for commits), ``--out`` elsewhere.
``import`` restores every such file into the store at ``--storage`` (an empty one in a fresh
clone), skipping studies it has: ``mlrc campaign run`` then resumes where the files stop.
``check`` is the determinism check: the campaign's contrastive, multi_similarity and ntxent
studies must repeat the pruning corpus's studies (bench/pruning.py: same sampler, seed and
preset; a trial's parameters and fold seeds do not depend on the study's name), trial for
trial — parameters, state, value and every fold's validation curve, exactly.
``corpus`` writes the replay corpus of the campaign's finished studies
(``bench/corpus/cpu-reality-check.json.gz``, :func:`mlrc.search.replay.write_corpus`): each
study's trials and fold curves, and its reproductions' fold validation values (the reseeds that
give δ to ``mlrc replay --certify``), with the machine, the date and the commit.
``certify`` certifies the pruning rules of :data:`CANDIDATES` on that corpus
(:func:`mlrc.search.certify.certify` at 20, 30, 40 and 50 trials) and writes the certified risk
a pruned study carries, ``mlrc/resources/certified_risk.json``
(:func:`mlrc.search.certify.risk_table`), and a markdown table of it on stdout
(docs/guide/performance.md quotes it).
"""

from __future__ import annotations

import argparse
import dataclasses
import datetime as dt
import subprocess
import sys
from pathlib import Path

import yaml

REPO = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(REPO))

from mlrc import store  # noqa: E402
from mlrc.config.campaign import cells, load_campaign  # noqa: E402
from mlrc.search import replay as rp  # noqa: E402
from mlrc.search.campaign_runner import progress  # noqa: E402
from mlrc.search.errors import StudyError  # noqa: E402
from mlrc.search.transfer import (  # noqa: E402
    export_study,
    import_study,
    read_study_file,
    write_study_file,
)

CAMPAIGN = REPO / "studies/campaigns/cpu-reality-check.yaml"
FILES = REPO / "studies/campaigns/cpu-reality-check"
CORPUS = REPO / "bench/corpus/cpu-omniglot-glyphs.json.gz"
REALITY_CORPUS = REPO / "bench/corpus/cpu-reality-check.json.gz"
RISK = REPO / "mlrc/resources/certified_risk.json"  # written by certify


def study_names() -> list[tuple[str, str, str]]:
    """(study, dataset, loss) of every study of the campaign, in its order."""
    cfg = load_campaign(CAMPAIGN, check_roots=False)
    return [(c.name, c.column, c.row) for c in cells(cfg)]


def export(url: str, every: bool, out: Path = FILES) -> None:
    engine = store.connect(url, read_only=True)
    for name, _, _ in study_names():
        state = progress(engine, name).state
        if state != "done" and not (every and state != "not started"):
            print(f"{name}: {state}, not exported")
            continue
        changed = write_study_file(export_study(url, name), out / f"{name}.json.gz")
        print(f"{name}: {state}, {'written' if changed else 'unchanged'}")


def restore(url: str, files: Path = FILES) -> None:
    engine = store.connect(url)
    for path in sorted(files.glob("*.json.gz")):
        doc = read_study_file(path)
        if store.studies.study_named(engine, doc["name"]) is not None:
            print(f"{doc['name']}: in the store already, skipped")
            continue
        import_study(url, doc)
        print(f"{doc['name']}: restored from {path}")


def check(url: str, corpus: Path) -> int:
    """Compare the campaign's studies with the corpus's, trial by trial (parameters, then
    parameters, state, value and curves); the number of studies whose curves differ."""
    _, recorded = rp.read_corpus(corpus)
    by_name = {s.name: s for s in recorded}
    engine = store.connect(url, read_only=True)
    bad = 0
    for name, dataset, loss in study_names():
        ref = by_name.get(f"corpus-{loss}-{dataset}")
        if ref is None or store.studies.study_named(engine, name) is None:
            continue
        try:
            ours = rp.recorded_study(engine, name, finished=False).trials
        except StudyError:  # no complete trial yet
            continue
        pairs = list(zip(ours, ref.trials, strict=False))
        params = sum(a.params == b.params for a, b in pairs)
        same = sum(a == b for a, b in pairs)
        first = next((a.number for a, b in pairs if a != b), None)
        bad += first is not None
        where = "all identical" if first is None else f"first difference: trial {first}"
        print(
            f"{name} vs {ref.name}: of {len(pairs)} trials, {params} with the same parameters, "
            f"{same} identical ({where})"
        )
    return bad


def corpus(url: str, out: Path) -> None:
    """The replay corpus of every finished study of the campaign (see the module docstring)."""
    sys.path.insert(0, str(REPO / "bench"))
    from common import machine

    engine = store.connect(url, read_only=True)
    done = [n for n, _, _ in study_names() if progress(engine, n).state == "done"]
    studies = [rp.recorded_study(engine, n) for n in done]
    commit = subprocess.run(["git", "rev-parse", "--short", "HEAD"], capture_output=True, text=True)
    about = {
        "made_by": "bench/reality_check.py corpus " + " ".join(sys.argv[2:]),
        "campaign": str(CAMPAIGN.relative_to(REPO)),
        "machine": machine(),
        "date": dt.date.today().isoformat(),
        "commit": commit.stdout.strip(),
        "preset": "cpu",
        "trials": 50,
    }
    print(f"wrote {rp.write_corpus(studies, out, about)} ({len(studies)} studies)")


def candidates() -> list:
    """The rules certified: no pruner, median, Wilcoxon, forgiving and the sequential test at
    four δ, each alone and with the in-fold gain rule (its defaults)."""
    from mlrc.config.schema import StopSpec
    from mlrc.search.pruning import Rules

    between = [Rules(), Rules("median", 5), Rules("wilcoxon", prune_p=0.3), Rules("forgiving", 5)]
    between += [Rules("sequential", 5, prune_delta=d) for d in (0.02, 0.03, 0.04, 0.06)]
    return [r for b in between for r in (b, dataclasses.replace(b, stop=StopSpec()))]


def certified(corpus_path: Path, jobs: int) -> None:
    """Certify :func:`candidates` on the corpus; write the table; print it (see the docstring)."""
    import json

    from mlrc.search.certify import certify, risk_table

    about, studies = rp.read_corpus(corpus_path)
    result = certify(studies, candidates(), processes=jobs)
    folds = {s.n_folds for s in studies}
    search = yaml.safe_load(CAMPAIGN.read_text())["search"]  # the campaign's sampler
    table = risk_table(result, {"corpus": str(corpus_path.relative_to(REPO)),
                                "preset": about.get("preset", "cpu"), "folds": folds.pop(),
                                "sampler": search["sampler"]})  # fmt: skip
    RISK.write_text(json.dumps(table, indent=1, sort_keys=True) + "\n")
    print(f"wrote {RISK.relative_to(REPO)}: {table['studies']} studies, δ {table['delta']}")
    print("| rules | " + " | ".join(f"{n} trials" for n in result["budgets"]) + " |")
    print("|---|" + "--:|" * len(result["budgets"]))
    rows = {**table["rules"], "tuned, one study out": table["leave_one_study_out"]}
    for label, by in rows.items():
        cells = [f"{f['fold_epochs_fraction']:.2f}× · {f['within']}/{f['studies']} "
                 f"(≥ {f['within_bounds'][0]:.2f})" for f in by.values()]  # fmt: skip
        print(f"| {label} | " + " | ".join(cells) + " |")
    print(f"recommended: {table['recommended']}")
    print(f"trial of the 50-trial choice (within δ), per study: {result['trials_needed']}")
    for m in (8, 10, 12, 15, 20):
        spent, within = patience_stop(studies, table["delta"], m)
        print(f"search stop after {m} trials without a new best: {spent:.2f}× the trials, "
              f"{within} of {len(studies)} within δ")  # fmt: skip


def patience_stop(studies: list, deltas: dict, m: int) -> tuple[float, int]:
    """A search-level stop replayed: each study's trials in order, stopped once ``m`` trials
    in a row set no new best; (trials spent as a fraction of all, studies whose best at the
    stop is within δ of the best of all)."""
    spent = total = within = 0
    for s in studies:
        values = [t.value if t.value is not None else 0.0 for t in s.trials]
        best, last = values[0], 0
        for i, v in enumerate(values):
            if v > best:
                best, last = v, i
            if i - last >= m:
                break
        spent, total = spent + i + 1, total + len(values)
        within += best >= max(values) - deltas[s.dataset] - 1e-12
    return spent / total, within


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    sub = ap.add_subparsers(dest="cmd", required=True)
    for cmd in ("export", "import", "check", "corpus"):
        p = sub.add_parser(cmd)
        p.add_argument("--storage", required=True, help="SQLAlchemy URL of the campaign's store")
    p = sub.add_parser("certify")
    p.add_argument("--corpus", type=Path, default=REALITY_CORPUS, help="the replay corpus")
    p.add_argument("--jobs", type=int, default=1, help="processes")
    sub.choices["export"].add_argument("--all", action="store_true", help="unfinished too")
    sub.choices["export"].add_argument("--out", type=Path, default=FILES, help="folder")
    sub.choices["import"].add_argument("--files", type=Path, default=FILES, help="folder")
    sub.choices["check"].add_argument("--corpus", type=Path, default=CORPUS)
    sub.choices["corpus"].add_argument("--out", type=Path, default=REALITY_CORPUS, help="file")
    a = ap.parse_args()
    if a.cmd == "export":
        export(a.storage, a.all, a.out)
    elif a.cmd == "import":
        restore(a.storage, a.files)
    elif a.cmd == "corpus":
        corpus(a.storage, a.out)
    elif a.cmd == "certify":
        certified(a.corpus.resolve(), a.jobs)
    else:
        sys.exit(1 if check(a.storage, a.corpus) else 0)


if __name__ == "__main__":
    main()
