"""A study name reused with another configuration: refused, or archived with ``--force-new``
(store rows, Optuna study and artifacts renamed to NAME.old-K; nothing deleted)."""

from __future__ import annotations

from pathlib import Path

import optuna
import yaml
from sqlalchemy import select
from typer.testing import CliRunner

from mlrc import store
from mlrc.cli import app
from mlrc.store.engine import session
from mlrc.store.schema import FoldRun, Study

runner = CliRunner()


def _study(tmp_path: Path, max_epochs: int) -> Path:
    doc = {
        "name": "dup",
        "dataset": {"name": "glyphs"},
        "preset": "cpu",
        "loss": {"name": "contrastive", "params": {"pos_margin": 0.0, "neg_margin": 1.0}},
        "search": {"trials": 1},
        "overrides": {"iterations_per_epoch": 2, "max_epochs": max_epochs},
    }
    path = tmp_path / f"dup-{max_epochs}.yaml"
    path.write_text(yaml.safe_dump(doc))
    return path


def test_changed_study_is_refused_then_archived_with_force_new(tmp_path):
    url, art = f"sqlite:///{tmp_path / 's.db'}", tmp_path / "art"
    opts = ["--storage", url, "--artifacts", str(art), "--quiet", "--keep", "all"]  # files moved
    first = runner.invoke(app, ["study", "run", str(_study(tmp_path, 1)), *opts])
    assert first.exit_code == 0, first.output
    changed = str(_study(tmp_path, 2))

    refused = runner.invoke(app, ["study", "run", changed, *opts])
    assert refused.exit_code == 2
    assert "max_epochs: 1 in the store, 2 now" in refused.output
    assert "--force-new" in refused.output

    forced = runner.invoke(app, ["study", "run", changed, *opts, "--force-new"])
    assert forced.exit_code == 0, forced.output
    engine = store.connect(url)
    with session(engine) as s:
        studies = {st.name: st for st in s.scalars(select(Study))}
        assert set(studies) == {"dup", "dup.old-1"}
        assert studies["dup.old-1"].config["preset"]["max_epochs"] == 1
        assert studies["dup"].config["preset"]["max_epochs"] == 2
        old_ckpts = s.scalars(
            select(FoldRun.checkpoint).filter_by(study_id=studies["dup.old-1"].id)
        ).all()
    assert len(old_ckpts) == 4
    assert all(c.startswith(f"{art / 'dup.old-1'}/") and Path(c).is_file() for c in old_ckpts)
    names = {s.study_name: s.n_trials for s in optuna.get_all_study_summaries(url)}
    assert names == {"dup": 1, "dup.old-1": 1}
