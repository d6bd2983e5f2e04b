"""Write studies/modern/<dataset>/<loss>.yaml: one study file per cell of
studies/campaigns/modern.yaml (the same studies, for running one at a time or on a cluster).

    .venv/bin/python scripts/modern_studies.py [--out studies/modern]

The files are generated, never edited by hand: tests/e2e/test_modern_studies.py checks that the
committed ones equal this script's output."""

from __future__ import annotations

import argparse
from pathlib import Path

import yaml

from mlrc.config.campaign import cells, load_campaign

REPO = Path(__file__).resolve().parents[1]
CAMPAIGN = REPO / "studies" / "campaigns" / "modern.yaml"


def study_files(campaign: Path = CAMPAIGN) -> dict[str, str]:
    """Relative path → text of every study file of the campaign."""
    cfg = load_campaign(campaign, check_roots=False)
    out = {}
    for cell in cells(cfg, str(campaign)):
        doc = cell.study.model_dump(mode="json", by_alias=True, exclude_defaults=True)
        label = cell.row
        head = (
            f"# {cell.study.dataset.name} × {label} with the modern preset: generated from "
            "studies/campaigns/modern.yaml\n# by scripts/modern_studies.py (do not edit; edit "
            "the campaign and run the script). Set dataset.root\n# to your copy of the dataset.\n"
        )
        out[f"{cell.column}/{label}.yaml"] = head + yaml.safe_dump(doc, sort_keys=False)
    return out


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--out", type=Path, default=REPO / "studies" / "modern")
    args = ap.parse_args()
    for rel, text in study_files().items():
        path = args.out / rel
        path.parent.mkdir(parents=True, exist_ok=True)
        path.write_text(text)
    print(f"wrote {len(study_files())} study files under {args.out}")


if __name__ == "__main__":
    main()
