"""The GPU check's table (``bench/gpu_check.py``): its parts' records → one markdown table,
the card's name in its header, ready for docs/guide/performance.md, and the same as JSON.
Standard library only. A figure whose part failed is ``n/a``; the line under the table says
how each part ended."""

from __future__ import annotations

from typing import Any

GOAL_BUSY = 85.0  # % GPU busy, one fold (bench/gpu_fold.py's goals, issue #22)
GOAL_RATIO = 0.85  # × the synthetic-input upper bound
GOAL_PACKED = 2.5  # 4 packed folds ÷ one fold, total img/s


def card_name(env: dict[str, Any]) -> str:
    """``NVIDIA H200``, ``2 × NVIDIA H200``, or what the rehearsal ran on."""
    if env.get("mode") == "rehearse":
        return "CPU rehearsal (no GPU)"
    gpus = env.get("gpus") or []
    if not gpus:
        return "no GPU found"
    name = gpus[0].get("name", "GPU")
    return f"{len(gpus)} × {name}" if len(gpus) > 1 else name


def find(records: list[dict], part: str, section: str, measure: str, **match: Any) -> Any:
    """The value of the first row of ``part`` with that section and measure (and ``match``)."""
    for rec in records:
        if rec.get("part") != part:
            continue
        for row in rec.get("rows") or []:
            same = row.get("section") == section and row.get("measure") == measure
            if same and all(row.get(k) == v for k, v in match.items()):
                return row.get("value")
    return None


def line(measure: str, value: Any, unit: str = "", goal: str = "", met: bool | None = None):
    return {"measure": measure, "value": value, "unit": unit, "goal": goal, "met": met}


def fold_lines(records: list[dict], part: str, loss: str) -> list[dict]:
    """One fold against its upper bound (``part``: fold or fold_lowsync)."""
    sec = "fold" if loss == "contrastive" else f"fold ({loss})"
    up = "upper bound" if loss == "contrastive" else f"upper bound ({loss})"
    img = find(records, part, sec, "train_fold img/s")
    busy = find(records, part, sec, "GPU busy")
    ratio = find(records, part, sec, "÷ upper bound")
    out = [
        line(f"`reference` fold, {loss}: `train_fold`", img, "img/s"),
        line("… GPU busy", busy, "%", f"≥ {GOAL_BUSY:.0f} %", meets(busy, GOAL_BUSY)),
        line(f"… synthetic-input upper bound ({loss})", find(records, part, up, "synthetic on-device img/s"), "img/s"),
        line("… fold ÷ upper bound", ratio, "×", f"≥ {GOAL_RATIO}", meets(ratio, GOAL_RATIO)),
    ]  # fmt: skip
    if part == "fold":
        out += [
            line("… first batch, epoch 1", find(records, part, sec, "first batch, epoch 1"), "s"),
            line("… first batch, epoch 2", find(records, part, sec, "first batch, epoch 2"), "s"),
            line("… `last.pt` write, mean", find(records, part, sec, "last.pt write, mean"), "s"),
        ]
    return out


def packed_lines(records: list[dict], part: str) -> list[dict]:
    """k packed folds: total img/s, × the one fold of part ``fold``, GPU busy."""
    one = find(records, "fold", "fold", "train_fold img/s")
    mps = part == "mps"
    out = []
    counts = {r.get("workers") for r in rows_of(records, part) if r.get("workers")}
    for k in sorted(counts or ({4} if mps else {2, 4})):
        total = find(records, part, "packed", "total img/s", workers=k)
        times = total / one if total and one else None
        goal = f"≥ {GOAL_PACKED} × one" if k == 4 else ""
        label = f"{k} folds packed on one GPU{' under MPS' if mps else ''}"
        out += [
            line(f"{label}: total", total, "img/s"),
            line("… × one fold", times, "×", goal, meets(times, GOAL_PACKED) if k == 4 else None),
            line("… GPU busy", find(records, part, "packed", "GPU busy", workers=k), "%"),
        ]
    return out


def rows_of(records: list[dict], part: str) -> list[dict]:
    return [row for rec in records if rec.get("part") == part for row in rec.get("rows") or []]


def test_lines(records: list[dict]) -> list[dict]:
    for rec in records:
        if rec.get("part") == "tests" and rec.get("tests"):
            t = rec["tests"]
            text = f"{t['passed']} passed, {len(t['failed'])} failed, {t['skipped']} skipped"
            return [line("GPU tests (test_gpu.py, CUDA tests of tests/protocol)", text, "",
                         "all pass", not t["failed"])]  # fmt: skip
    return [line("GPU tests (test_gpu.py, CUDA tests of tests/protocol)", None)]


def rank_lines(records: list[dict]) -> list[dict]:
    """One fold as K processes: img/s, and × K = 1 where K = 1 ran."""
    rows = rows_of(records, "ranks")
    one = any(str(r.get("processes")) == "1" for r in rows)
    out = []
    for r in rows:
        k = str(r.get("processes"))
        got = line(
            f"one fold as {k} process{'' if k == '1' else 'es'}", fnum(r.get("img_per_s")), "img/s"
        )
        if one:
            got["note"] = f"× {float(r['speedup']):.2f} of K = 1"
        out.append(got)
    return out


def fnum(text: Any) -> float | None:
    try:
        return float(text)
    except (TypeError, ValueError):
        return None


def meets(value: float | None, goal: float) -> bool | None:
    return None if value is None else value >= goal


def build(records: list[dict], env: dict[str, Any], low_sync_loss: str) -> dict[str, Any]:
    """The table as JSON: card, date, mode, its lines, and how each part ended."""
    lines = fold_lines(records, "fold", "contrastive")
    lines += fold_lines(records, "fold_lowsync", low_sync_loss)
    lines += test_lines(records) + packed_lines(records, "packed") + packed_lines(records, "mps")
    lines += rank_lines(records)
    parts = [{k: rec.get(k) for k in ("part", "status", "seconds", "reason")} for rec in records]
    return {
        "card": card_name(env),
        "date": env.get("date", ""),
        "mode": env.get("mode", ""),
        "rows": lines,
        "parts": parts,
    }


def fmt(value: Any, unit: str) -> str:
    if value is None:
        return "n/a"
    if isinstance(value, str):
        return value
    if unit == "%" or abs(value) >= 100:
        text = f"{value:.0f}"
    elif abs(value) >= 10:
        text = f"{value:.1f}"
    else:
        text = f"{value:.3g}" if unit != "×" else f"{value:.2f}"
    return f"{text} {unit}".strip() if unit not in ("×",) else f"{text} ×"


def markdown(table: dict[str, Any]) -> str:
    """The table in markdown, then one line on how each part ended."""
    head = f"{table['card']}, {table['date'][:10]}".rstrip(", ")
    out = [f"| measure | {head} | goal | met |", "| --- | --- | --- | --- |"]
    for r in table["rows"]:
        met = {True: "yes", False: "no", None: ""}[r["met"]]
        value = fmt(r["value"], r["unit"])
        if r.get("note"):
            value += f" ({r['note']})"
        out.append(f"| {r['measure']} | {value} | {r['goal']} | {met} |")
    ended = []
    for p in table["parts"]:
        took = f" {p['seconds']:.0f} s" if p.get("seconds") else ""
        why = f" ({p['reason']})" if p.get("reason") and p["status"] != "ok" else ""
        ended.append(f"{p['part']} {p['status']}{took}{why}")
    return "\n".join(out) + "\n\nParts: " + " · ".join(ended) + "\n"
