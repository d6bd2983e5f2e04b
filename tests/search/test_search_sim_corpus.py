"""``bench/search_sim.py --corpus``: the surrogates' material read from the committed corpus
file — each study's search space (its loss's, resolved for its dataset and preset) holds every
recorded point, and each trial's value and fold SEM are those of its folds (numpy's mean and
scipy's standard error, not the bench's formula)."""

from __future__ import annotations

import sys
from pathlib import Path

import numpy as np
from scipy import stats

ROOT = Path(__file__).resolve().parents[2]
sys.path.insert(0, str(ROOT))

from bench import search_sim  # noqa: E402
from mlrc.search import replay as rp  # noqa: E402


def test_the_corpus_file_gives_each_study_its_space_values_and_fold_sems():
    _, studies = rp.read_corpus(search_sim.CORPUS)
    corpus = search_sim.load_corpus_file(search_sim.CORPUS, 50)
    assert sorted(corpus) == sorted(s.name for s in studies)
    for st in studies:
        c = corpus[st.name]
        done = [t for t in st.trials if t.state == "complete" and t.value is not None]
        folds = [[f.objective for f in t.folds] for t in done]
        assert len(c.values) == len(done) == 50
        np.testing.assert_allclose(c.values, [np.mean(v) for v in folds], rtol=0, atol=1e-12)
        np.testing.assert_allclose(c.sems, [stats.sem(v) for v in folds], rtol=0, atol=1e-12)
        for t in done:  # the resolved space names the recorded parameters and holds each point
            assert set(c.space) == set(t.params), (st.name, t.number)
            for name, d in c.space.items():
                v = t.params[name]
                inside = v in d.choices if hasattr(d, "choices") else d.low <= v <= d.high
                assert inside, (st.name, t.number, name, v)


def test_a_corpus_shorter_than_the_minimum_gives_no_study():
    assert search_sim.load_corpus_file(search_sim.CORPUS, 51) == {}
