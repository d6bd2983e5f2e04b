"""Write studies/modern/<dataset>/<loss>.yaml: one study file per cell of
studies/campaigns/modern.yaml (the same studies, for running one at a time or on a cluster), and
studies/modern/4gpu/<dataset>/<loss>.yaml from studies/campaigns/modern-4gpu.yaml (the same
losses at Hyp-ViT's batch, one fold on 4 GPUs).

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
CAMPAIGN_4GPU = REPO / "studies" / "campaigns" / "modern-4gpu.yaml"
RUN_4GPU = """\
# One fold = 4 processes of torch.distributed, one GPU each (processes_per_trial: 4). On one node
# of 4 GPUs:  mlrc study run {path} --device cuda
# (or a pool worker: mlrc worker {path} --storage $MLRC_STORAGE --devices cuda:0,cuda:1,cuda:2,cuda:3)
# On Slurm, one 4-GPU job per worker:
#   mlrc slurm submit {path} --workers 4 --time 24:00:00 --gpus-per-worker 4 --cpus-per-worker 4
"""


def study_files(campaign: Path = CAMPAIGN, prefix: str = "") -> dict[str, str]:
    """Relative path → text of every study file of the campaign (both campaigns by default,
    the 4-GPU one under ``4gpu/``)."""
    cfg = load_campaign(campaign, check_roots=False)
    source = campaign.relative_to(REPO)
    out = {}
    for cell in cells(cfg, str(campaign)):
        doc = cell.study.model_dump(mode="json", by_alias=True, exclude_defaults=True)
        label = cell.row
        rel = f"{prefix}{cell.column}/{label}.yaml"
        head = (
            f"# {cell.study.dataset.name} × {label} with the modern preset: generated from "
            f"{source}\n# by scripts/modern_studies.py (do not edit; edit "
            "the campaign and run the script). Set dataset.root\n# to your copy of the dataset.\n"
        )
        if prefix:
            head += RUN_4GPU.format(path=f"studies/modern/{rel}")
        out[rel] = head + yaml.safe_dump(doc, sort_keys=False)
    if campaign == CAMPAIGN and not prefix:
        out.update(study_files(CAMPAIGN_4GPU, "4gpu/"))
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
