"""Dashboards (`mlrc dashboard build|serve`) checked in a real headless Chromium, and
optuna-dashboard on the same store.

One small real study (glyphs, cpu preset, TINY, 3 trials, 2 reproductions) plus two studies
written straight into the store for the edge cases: one without trials, one whose only trial
failed with a reason full of markup (it must be shown as text, never run). Every number the page
shows is compared with the store (and the CIs with scipy's t-interval)."""

from __future__ import annotations

import http.client
import importlib.util
import io
import json
import shutil
import signal
import socket
import subprocess
import sys
import time
import urllib.error
import urllib.request
from pathlib import Path

import numpy as np
import pytest
from conftest import require
from scipy import stats
from sqlalchemy import select
from test_session import cli, study_file
from typer.testing import CliRunner

from mlrc import store
from mlrc.cli.dashboard import dashboard_app
from mlrc.store.engine import get_study, session
from mlrc.store.schema import (
    Baseline,
    CampaignStudy,
    EpochMetric,
    FoldRun,
    Study,
    StudyBaseline,
    TestResult,
    Trial,
)

runner = CliRunner()
XSS = (
    "non-finite loss at iteration 3 <script>window.__xss=1</script>"
    '<img src=x onerror="window.__xss=2"> & "q"'
)
CHARTS_PER_STUDY = ("history", "importance", "parallel", "slice", "folds", "retrieval-map")


def dash(*args: str, ok: bool = True):
    r = runner.invoke(dashboard_app, list(args))
    if ok:
        assert r.exit_code == 0, r.output
    return r


@pytest.fixture(scope="module")
def browser():
    """Headless Chromium through Selenium (console errors via goog:loggingPrefs)."""
    binary = next(
        (p for p in map(shutil.which, ("chromium", "chromium-browser", "google-chrome")) if p),
        None,
    )
    driver_path = shutil.which("chromedriver")
    require(
        binary is not None and driver_path is not None,
        "headless Chromium and its driver are not installed (apt-get install chromium "
        "chromium-driver)",
    )
    require(
        importlib.util.find_spec("selenium") is not None,
        "selenium is not installed (pip install selenium==4.51.0)",
    )
    from selenium import webdriver
    from selenium.webdriver.chrome.service import Service

    opts = webdriver.ChromeOptions()
    opts.binary_location = binary
    for a in (
        "--headless=new",
        "--no-sandbox",
        "--disable-dev-shm-usage",
        "--window-size=1400,1000",
    ):
        opts.add_argument(a)
    opts.set_capability("goog:loggingPrefs", {"browser": "ALL"})
    driver = webdriver.Chrome(options=opts, service=Service(driver_path))
    driver.set_page_load_timeout(60)
    yield driver
    driver.quit()


@pytest.fixture(scope="module")
def store_url(tmp_path_factory):
    """The real study `dash`, then `waiting` (no trials) and `broken` (one failed trial)."""
    tmp = tmp_path_factory.mktemp("dashboard")
    path = study_file(tmp, name="dash", trials=3, reps=2)
    url, art = f"sqlite:///{tmp / 'db.sqlite'}", tmp / "art"
    cli("study", "run", str(path), "--storage", url, "--artifacts", str(art), "--quiet")
    cli("study", "test", str(path), "--storage", url, "--artifacts", str(art), "--quiet")
    with session(store.connect(url)) as s:
        for name in ("waiting", "broken"):
            s.add(
                Study(
                    name=name,
                    dataset="glyphs",
                    loss="contrastive",
                    strategy=None,
                    preset="cpu",
                    config={},
                    code_version="test",
                )
            )
        s.flush()
        broken = get_study(s, "broken")
        s.add(
            CampaignStudy(
                campaign="grid",
                study_id=get_study(s, "dash").id,
                position=0,
                campaign_config={},
            )
        )
        s.add(
            Trial(
                study_id=broken.id,
                number=0,
                params={"pos_margin": "<i>1.5</i>"},
                params_hash="h",
                state="failed",
                reason=XSS,
            )
        )
    return url


def q(url: str, model) -> list:
    with session(store.connect(url)) as s:
        return s.execute(select(model)).scalars().all()


def study_id(url: str, name: str) -> int:
    with session(store.connect(url)) as s:
        return get_study(s, name).id


# --- browser helpers ---------------------------------------------------------------------------

CHARTS_JS = """
const arr = v => (v === undefined || v === null) ? null : Array.from(v);
return Array.from(document.querySelectorAll('figure.chart')).map(f => {
  const gd = f.querySelector('.plotly-graph-div');
  return {kind: f.dataset.kind, study: f.dataset.study || null,
          svg: gd.querySelectorAll('.main-svg').length,
          data: gd.data.map(t => ({name: t.name, type: t.type, x: arr(t.x), y: arr(t.y),
                                   err: t.error_y ? arr(t.error_y.array) : null,
                                   meta: t.meta || null, mode: t.mode || null,
                                   line: t.line && t.line.color ? t.line.color : null,
                                   color: (t.marker && (Array.isArray(t.marker.color)
                                           || ArrayBuffer.isView(t.marker.color)))
                                          ? arr(t.marker.color) : null}))};
});
"""


def load(driver, url: str, charts: int) -> list[dict]:
    """Open ``url``, wait until Plotly has drawn ``charts`` charts, return their data."""
    from selenium.webdriver.support.ui import WebDriverWait

    driver.get(url)
    WebDriverWait(driver, 30).until(
        lambda d: (
            d.execute_script(
                "const g = document.querySelectorAll('.plotly-graph-div');"
                "return Array.from(g).filter(x => x.querySelector('.main-svg')).length;"
            )
            == charts
        )
    )
    return driver.execute_script(CHARTS_JS)


def severe(driver) -> list[dict]:
    return [e for e in driver.get_log("browser") if e["level"] == "SEVERE"]


def png_std(png: bytes) -> tuple[float, int]:
    from PIL import Image

    img = Image.open(io.BytesIO(png)).convert("RGB")
    a = np.asarray(img, dtype=np.float64)
    colours = len(img.getcolors(maxcolors=1 << 20) or [])
    return float(a.std()), colours


def full_page_png(driver) -> bytes:
    height = driver.execute_script("return document.documentElement.scrollHeight")
    driver.set_window_size(1400, min(height + 120, 8000))
    try:
        return driver.get_screenshot_as_png()
    finally:
        driver.set_window_size(1400, 1000)


# --- build -------------------------------------------------------------------------------------


def test_built_page_renders_every_view_with_the_stores_numbers(browser, store_url, tmp_path):
    out = tmp_path / "report.html"
    dash("build", "--out", str(out), "--storage", store_url)
    page = out.read_text(encoding="utf-8")
    # self-contained: plotly.js inlined once, nothing fetched from elsewhere
    assert "<script src" not in page.replace('<script type="text/javascript" src', "<script src")
    assert page.count("Plotly.newPlot(") == 1 + len(CHARTS_PER_STUDY)

    charts = load(browser, out.as_uri(), 1 + len(CHARTS_PER_STUDY))
    assert severe(browser) == []
    kinds = [(c["kind"], c["study"]) for c in charts]
    assert kinds == [("test", None)] + [(k, "dash") for k in CHARTS_PER_STUDY]
    assert all(c["svg"] >= 1 for c in charts)
    resources = browser.execute_script(
        "return performance.getEntriesByType('resource').map(r => r.name)"
    )
    assert all(not r.startswith("http") for r in resources), resources

    # not blank: the whole page and every chart on its own
    std, colours = png_std(full_page_png(browser))
    assert std > 20 and colours > 50
    (tmp_path / "page.png").write_bytes(full_page_png(browser))
    for el in browser.find_elements("css selector", "figure.chart .plotly-graph-div"):
        std, colours = png_std(el.screenshot_as_png)
        assert std > 5 and colours > 20, el.get_attribute("id")

    by_kind = {c["kind"]: c for c in charts}
    sid = study_id(store_url, "dash")
    trials = sorted((t for t in q(store_url, Trial) if t.study_id == sid), key=lambda t: t.number)
    assert [t.state for t in trials] == ["complete"] * 3

    # optimisation history: each trial's value ± SEM, best so far
    h = {t["meta"]["role"]: t for t in by_kind["history"]["data"] if t["meta"]}
    assert h["trials"]["x"] == [t.number for t in trials]
    assert h["trials"]["y"] == pytest.approx([t.value for t in trials], abs=1e-12)
    assert h["trials"]["err"] == pytest.approx([t.sem for t in trials], abs=1e-12)
    assert h["best"]["y"] == pytest.approx(np.maximum.accumulate([t.value for t in trials]))

    # trial table: the same values, as stored
    rows = browser.execute_script(
        'return Array.from(document.querySelectorAll(\'section[data-study="dash"] '
        "table.trials tr[data-trial]')).map(r => [r.dataset.trial, "
        "r.children[2].dataset.value, r.children[2].textContent, r.children[1].textContent])"
    )
    assert [int(r[0]) for r in rows] == [t.number for t in trials]
    for (_, exact, shown, state), t in zip(rows, trials, strict=True):
        assert float(exact) == t.value and shown == f"{t.value:.4f}" and state == t.state

    # importance (Optuna's fANOVA on Optuna's tables): one bar per searched parameter
    imp = by_kind["importance"]["data"][0]
    assert sorted(imp["y"]) == sorted(trials[0].params) and sum(imp["x"]) == pytest.approx(1)

    # slice: each point is a trial's (parameter value, objective), one panel per parameter
    points = [t for t in by_kind["slice"]["data"] if t["color"]]
    assert len(points) == len(trials[0].params)
    for trace in points:
        numbers = [int(n) for n in trace["color"]]
        by_n = {t.number: t for t in trials}
        assert trace["y"] == pytest.approx([by_n[n].value for n in numbers])
        assert any(
            trace["x"] == pytest.approx([by_n[n].params[p] for n in numbers])
            for p in trials[0].params
        )

    # parallel coordinates: one line per complete trial, none of them white on white
    lines = [t for t in by_kind["parallel"]["data"] if t["mode"] == "lines"]
    assert len(lines) == len(trials)
    for t in lines:
        rgb = [float(c) for c in t["line"].strip("rgba()").split(",")[:3]]
        assert sum(rgb) < 3 * 235, t["line"]

    # per-fold curves: every search fold run's epochs, and its best epoch starred
    folds = {f.id: f for f in q(store_url, FoldRun) if f.study_id == sid and f.kind == "search"}
    epochs: dict[int, list] = {}
    for e in sorted(q(store_url, EpochMetric), key=lambda e: e.epoch):
        if e.fold_run_id in folds:
            epochs.setdefault(e.fold_run_id, []).append(e)
    curves = [t for t in by_kind["folds"]["data"] if t["meta"]["role"] == "curve"]
    assert sorted(t["meta"]["id"] for t in curves) == sorted(folds) and len(folds) == 12
    for t in curves:
        f, es = folds[t["meta"]["id"]], epochs[t["meta"]["id"]]
        assert (t["meta"]["trial"], t["meta"]["fold"]) == (f.trial_number, f.fold)
        assert t["x"] == [e.epoch for e in es]
        assert t["y"] == pytest.approx([e.map_at_r for e in es], abs=1e-12)
    stars = {
        (t["meta"]["trial"], t["meta"]["fold"]): t
        for t in by_kind["folds"]["data"]
        if t["meta"]["role"] == "best_epoch"
    }
    assert len(stars) == 12
    for f in folds.values():
        star = stars[(f.trial_number, f.fold)]
        assert star["x"] == [f.best_epoch] and star["y"] == pytest.approx([f.map_at_r], abs=1e-12)

    # test MAP@R: mean and 95% t-interval half-width over the reproductions, per mode
    results = [r for r in q(store_url, TestResult) if r.study_id == sid and r.fold == -1]
    test = [t for t in by_kind["test"]["data"] if t["meta"]["role"] == "test"]
    assert {t["meta"]["mode"] for t in test} == {"separated", "concatenated"}
    for t in test:
        v = 100 * np.array(
            [
                r.map_at_r
                for r in sorted(results, key=lambda r: r.reproduction)
                if r.mode == t["meta"]["mode"]
            ]
        )
        low, high = stats.t.interval(0.95, len(v) - 1, loc=v.mean(), scale=stats.sem(v))
        assert len(v) == 2 and t["x"] == ["contrastive"] and t["meta"]["studies"] == ["dash"]
        assert t["y"] == pytest.approx([v.mean()], abs=1e-9)
        assert t["err"] == pytest.approx([(high - low) / 2], abs=1e-9)
    cell = browser.execute_script(
        "return document.querySelector('#tests table tbody tr:not(.baseline)')"
        ".children[5].textContent"
    )
    v = 100 * np.array([r.map_at_r for r in results if r.mode == "concatenated"])
    hw = stats.t.ppf(0.975, len(v) - 1) * stats.sem(v)
    assert cell.startswith(f"{v.mean():.2f} ± {hw:.2f}")
    # the study's untrained baseline, when `mlrc study test` stored one: first row and first
    # point, a single value
    links = [b for b in q(store_url, StudyBaseline) if b.study_id == sid]
    rows = browser.execute_script(
        "return Array.from(document.querySelectorAll('#tests table tbody tr')).map(r => "
        "[r.className, r.children[0].textContent, r.children[1].textContent, "
        "r.children[5].textContent])"
    )
    base = [t for t in by_kind["test"]["data"] if t["meta"]["role"] == "baseline"]
    if links:
        stored = {b.mode: b for b in q(store_url, Baseline) if b.key == links[0].key}
        label = stored["concatenated"].label
        assert rows[0] == ["baseline", label, "1", f"{100 * stored['concatenated'].map_at_r:.2f}"]
        assert [r[0] for r in rows[1:]] == [""] * (len(rows) - 1)
        assert {t["meta"]["mode"]: t["y"][0] for t in base} == pytest.approx(
            {m: 100 * b.map_at_r for m, b in stored.items()}
        )
        assert all(t["x"] == [label] for t in base)
    else:  # a store without baselines: no baseline row or point
        assert base == [] and all(r[0] == "" for r in rows)

    # edge cases: a study without trials, a failed trial whose reason is markup
    assert (
        "No trials yet"
        in browser.find_element("css selector", 'section[data-study="waiting"] .note').text
    )
    broken = browser.find_element("css selector", 'section[data-study="broken"]')
    notes = [n.get_attribute("data-kind") for n in broken.find_elements("css selector", ".note")]
    assert notes == ["history", "importance", "parallel", "slice", "folds"]
    assert "No complete trial yet" in broken.text and "no Optuna study named broken" in broken.text
    reason = broken.find_element("css selector", "td.reason")
    assert reason.get_attribute("textContent") == XSS
    assert "<i>1.5</i>" in broken.find_element("css selector", "table.trials").text
    assert browser.execute_script("return window.__xss === undefined")
    assert not broken.find_elements("css selector", "img, i, script")
    assert severe(browser) == []


def test_selection_empty_store_and_errors(browser, store_url, tmp_path):
    out = tmp_path / "one.html"
    dash("build", "--out", str(out), "--storage", store_url, "--study", "dash")
    charts = load(browser, out.as_uri(), 1 + len(CHARTS_PER_STUDY))
    assert {c["study"] for c in charts} == {None, "dash"}
    assert browser.find_elements("css selector", "section.study") and all(
        s.get_attribute("data-study") == "dash"
        for s in browser.find_elements("css selector", "section.study")
    )
    assert severe(browser) == []

    campaign = tmp_path / "campaign.html"
    dash("build", "--out", str(campaign), "--storage", store_url, "--campaign", "grid")
    page = campaign.read_text(encoding="utf-8")
    assert "Test results — campaign grid" in page and page.count('<section class="study"') == 1
    assert 'data-study="dash"' in page and 'data-study="broken"' not in page

    empty_url = f"sqlite:///{tmp_path / 'empty.db'}"
    store.connect(empty_url)  # an empty store: mlrc's tables, no study
    empty = tmp_path / "empty.html"
    dash("build", "--out", str(empty), "--storage", empty_url)
    assert load(browser, empty.as_uri(), 0) == []
    assert "No studies in this store yet" in browser.find_element("css selector", ".notice").text
    assert severe(browser) == []

    r = dash("build", "--out", str(out), "--storage", store_url, "--study", "nope", ok=False)
    assert r.exit_code == 2 and "error:" in r.output and "nope" in r.output
    r = dash("build", "--storage", store_url, "--campaign", "nope", "--out", str(out), ok=False)
    assert r.exit_code == 2 and "unknown campaign" in r.output
    missing = tmp_path / "missing.db"
    r = dash("build", "--out", str(out), "--storage", f"sqlite:///{missing}", ok=False)
    assert r.exit_code == 2 and "no such database file" in r.output and not missing.exists()


# --- serve -------------------------------------------------------------------------------------


_LOCAL = urllib.request.build_opener(urllib.request.ProxyHandler({}))  # 127.0.0.1: no proxy


def _get(url: str) -> tuple[int, str]:
    try:
        with _LOCAL.open(url, timeout=30) as r:
            return r.status, r.read().decode()
    except urllib.error.HTTPError as e:
        return e.code, e.read().decode()


def test_serve_live_page_follows_the_store(browser, store_url):
    cmd = [
        sys.executable,
        "-u",
        "-c",
        "from mlrc.cli.dashboard import dashboard_app; dashboard_app(prog_name='mlrc dashboard')",
        "serve",
        "--port",
        "0",
        "--storage",
        store_url,
        "--refresh",
        "2",
    ]
    proc = subprocess.Popen(cmd, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True)
    try:
        line = proc.stdout.readline()  # "serving http://127.0.0.1:PORT/ (...)"
        assert line.startswith("serving http://127.0.0.1:"), line + proc.stdout.read()
        base = line.split()[1]
        status, body = _get(base + "plotly.min.js")
        assert status == 200 and len(body) > 1_000_000
        assert _get(base + "nope")[0] == 404
        status, body = _get(base + "?campaign=grid")
        assert status == 200 and "campaign grid" in body and 'data-study="broken"' not in body
        status, body = _get(base + "?study=%3Cb%3Enope")
        assert status == 404 and "&lt;b&gt;nope" in body and "<b>nope" not in body

        charts = load(browser, base, 1 + len(CHARTS_PER_STUDY))
        assert severe(browser) == []
        assert [c["kind"] for c in charts] == ["test", *CHARTS_PER_STUDY]
        std, _ = png_std(browser.get_screenshot_as_png())
        assert std > 20
        assert "refreshes every 2 s" in browser.find_element("css selector", "header").text

        # the page reloads itself and re-reads the store: a new study shows up by itself
        with session(store.connect(store_url)) as s:
            s.add(
                Study(
                    name="late",
                    dataset="glyphs",
                    loss="triplet",
                    strategy=None,
                    preset="cpu",
                    config={},
                    code_version="test",
                )
            )
        from selenium.webdriver.support.ui import WebDriverWait

        WebDriverWait(browser, 20).until(
            lambda d: d.find_elements("css selector", 'section[data-study="late"]')
        )
        load(browser, browser.current_url, 1 + len(CHARTS_PER_STUDY))
        assert severe(browser) == []
    finally:
        proc.send_signal(signal.SIGINT)
        try:
            proc.wait(timeout=10)
        except subprocess.TimeoutExpired:
            proc.kill()
            proc.wait()
        with session(store.connect(store_url)) as s:
            late = get_study(s, "late")
            if late is not None:
                s.delete(late)


# --- optuna-dashboard --------------------------------------------------------------------------


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def test_optuna_dashboard_reads_the_store(store_url):
    require(
        importlib.util.find_spec("optuna_dashboard") is not None,
        "optuna-dashboard is not installed (pip install optuna-dashboard==0.21.0)",
    )
    exe = Path(sys.executable).with_name("optuna-dashboard")
    exe = str(exe) if exe.exists() else shutil.which("optuna-dashboard")
    require(exe is not None, "the optuna-dashboard command is not on PATH")
    port = _free_port()
    proc = subprocess.Popen(
        [exe, store_url, "--host", "127.0.0.1", "--port", str(port), "--quiet"],
        stdout=subprocess.DEVNULL,
        stderr=subprocess.PIPE,
        text=True,
    )
    try:
        deadline, listing = time.monotonic() + 60, None
        while time.monotonic() < deadline and proc.poll() is None:
            try:
                status, body = _get(f"http://127.0.0.1:{port}/api/studies")
                if status == 200:
                    listing = json.loads(body)
                    break
            except (urllib.error.URLError, ConnectionError, http.client.HTTPException):
                time.sleep(0.3)
        assert listing is not None, proc.stderr.read() if proc.poll() is not None else "timeout"
        names = {s["study_name"]: s["study_id"] for s in listing["study_summaries"]}
        assert "dash" in names
        status, body = _get(f"http://127.0.0.1:{port}/api/studies/{names['dash']}")
        assert status == 200
        values = {t["number"]: t["values"][0] for t in json.loads(body)["trials"]}
        sid = study_id(store_url, "dash")
        assert values == pytest.approx(
            {t.number: t.value for t in q(store_url, Trial) if t.study_id == sid}
        )
    finally:
        proc.terminate()
        try:
            proc.wait(timeout=10)
        except subprocess.TimeoutExpired:
            proc.kill()
            proc.wait()


# --- protocols, baselines, trials scored 0 ------------------------------------------------------


def _config(max_epochs: int) -> dict:
    """A config shaped like ``ResolvedStudy.fingerprint()``, reduced to what differs here."""
    return {
        "study": {"name": "x", "dataset": {"name": "glyphs"}, "loss": {"name": "x"}},
        "preset": {"trunk": "tiny_cnn", "max_epochs": max_epochs},
        "trials": 3,
        "sampler": "gp",
    }


# name: loss, max_epochs, test MAP@R per reproduction (fractions; the other metrics add 0.01)
GROUPED = {
    "g1-contrastive": ("contrastive", 1, [0.40, 0.42, 0.44]),
    "g1-triplet": ("triplet", 1, [0.20, 0.21, 0.22]),
    "g2-arcface": ("arcface", 2, [0.70, 0.72, 0.74]),  # above everything of protocol 1
}
GROUPED_BASELINE = ("kglyphs", "random_init", "Random init (tiny_cnn)", 0.05)
ZERO_REASON = "fold 2: non-finite loss at iteration 12 <b>x</b>"


@pytest.fixture(scope="module")
def grouped_url(tmp_path_factory) -> str:
    """Two protocols of glyphs (max_epochs 1 and 2), one random-init baseline shared by all,
    and g1-contrastive's search: trials 0 and 2 complete, trial 1 scored 0 (non-finite)."""
    url = f"sqlite:///{tmp_path_factory.mktemp('grouped') / 'db.sqlite'}"
    key, kind, label, value = GROUPED_BASELINE
    with session(store.connect(url)) as s:
        for mode in ("separated", "concatenated"):
            s.add(
                Baseline(
                    key=key,
                    dataset="glyphs",
                    kind=kind,
                    label=label,
                    trunk="tiny_cnn",
                    mode=mode,
                    map_at_r=value,
                    precision_at_1=value + 0.01,
                    r_precision=value + 0.01,
                    config={},
                )
            )
        for name, (loss, epochs, values) in GROUPED.items():
            st = Study(
                name=name,
                dataset="glyphs",
                loss=loss,
                strategy=None,
                preset="cpu",
                config=_config(epochs),
                code_version="test",
            )
            s.add(st)
            s.flush()
            s.add(StudyBaseline(study_id=st.id, key=key))
            for rep, v in enumerate(values, start=1):
                for mode in ("separated", "concatenated"):
                    s.add(
                        TestResult(
                            study_id=st.id,
                            reproduction=rep,
                            mode=mode,
                            fold=-1,
                            params={},
                            map_at_r=v,
                            precision_at_1=v + 0.01,
                            r_precision=v + 0.01,
                        )
                    )
            if name == "g1-contrastive":
                for number, value_, reason in (
                    (0, 0.3, None),
                    (1, 0.0, ZERO_REASON),
                    (2, 0.35, None),
                ):
                    s.add(
                        Trial(
                            study_id=st.id,
                            number=number,
                            params={"margin": 0.1 * number},
                            params_hash=f"h{number}",
                            state="complete",
                            value=value_,
                            sem=0.0 if reason else 0.01,
                            reason=reason,
                        )
                    )
    return url


def test_protocol_blocks_baseline_rows_and_zero_scored_trials(browser, grouped_url, tmp_path):
    from mlrc.report.tables import comparison_key

    out = tmp_path / "grouped.html"
    dash("build", "--out", str(out), "--storage", grouped_url)
    charts = load(browser, out.as_uri(), 2)  # the test figure, g1-contrastive's history
    assert severe(browser) == []
    k1, k2 = comparison_key(_config(1)), comparison_key(_config(2))
    assert k1 != k2
    by_kind = {c["kind"]: c for c in charts}

    # test figure: one panel per protocol, the baseline first as a single value
    test = by_kind["test"]["data"]
    titles = browser.execute_script(
        "return Array.from(document.querySelectorAll('figure[data-kind=test] .annotation-text'))"
        ".map(a => a.textContent)"
    )
    assert titles == [f"glyphs · {k1}", f"glyphs · {k2}"]
    studies = {
        (t["meta"]["protocol"], t["meta"]["mode"]): t for t in test if t["meta"]["role"] == "test"
    }
    assert studies[(k1, "concatenated")]["meta"]["studies"] == ["g1-contrastive", "g1-triplet"]
    assert studies[(k2, "separated")]["x"] == ["arcface"]
    for (_, _), t in studies.items():
        for name, y, err in zip(t["meta"]["studies"], t["y"], t["err"], strict=True):
            v = 100 * np.array(GROUPED[name][2])
            low, high = stats.t.interval(0.95, len(v) - 1, loc=v.mean(), scale=stats.sem(v))
            assert y == pytest.approx(v.mean()) and err == pytest.approx((high - low) / 2)
    base = [t for t in test if t["meta"]["role"] == "baseline"]
    assert sorted((t["meta"]["protocol"], t["meta"]["mode"]) for t in base) == sorted(
        (k, m) for k in (k1, k2) for m in ("separated", "concatenated")
    )
    for t in base:
        assert t["x"] == ["Random init (tiny_cnn)"] and t["err"] is None
        assert t["y"] == pytest.approx([100 * GROUPED_BASELINE[3]])
    categories = browser.execute_script(
        "const gd = document.querySelector('figure[data-kind=test] .plotly-graph-div');"
        "return [gd.layout.xaxis.categoryarray, gd.layout.xaxis2.categoryarray];"
    )
    assert categories == [
        ["Random init (tiny_cnn)", "contrastive", "triplet"],
        ["Random init (tiny_cnn)", "arcface"],
    ]

    # the tables: one per protocol, the baseline row first and unmarked, marks within a table
    tables = browser.execute_script(
        "return Array.from(document.querySelectorAll('#tests table')).map(t => ({"
        "protocol: t.dataset.protocol, rows: Array.from(t.querySelectorAll('tbody tr')).map(r => "
        "({cls: r.className, label: r.children[0].textContent, n: r.children[1].textContent, "
        "strong: r.querySelectorAll('strong').length, u: r.querySelectorAll('u').length, "
        "text: r.textContent}))}))"
    )
    assert [t["protocol"] for t in tables] == [k1, k2]
    for t in tables:
        first = t["rows"][0]
        assert first["cls"] == "baseline" and first["label"] == "Random init (tiny_cnn)"
        assert first["n"] == "1" and first["strong"] == first["u"] == 0 and "±" not in first["text"]
    g1 = {r["label"]: r for r in tables[0]["rows"][1:]}
    assert g1["contrastive"]["strong"] == 6 and g1["contrastive"]["u"] == 1  # kept its bold
    assert g1["triplet"]["strong"] == 0
    assert tables[1]["rows"][1]["label"] == "arcface" and tables[1]["rows"][1]["strong"] == 0
    legend = browser.find_element("css selector", "#tests div.legend").text
    assert f"differing in preset.max_epochs 1 vs 2 — {k1}: preset.max_epochs 1; {k2}" in legend
    assert "contrastive (glyphs, protocol " + k1 + "): 1 of 3 complete trials scored 0" in legend
    assert "Random init: the randomly initialised trunk" in legend

    # the zero-scored trial: its own trace with the reason, a flagged row in the trial table
    history = {t["meta"]["role"]: t for t in by_kind["history"]["data"] if t["meta"]}
    assert history["trials"]["x"] == [0, 2] and history["nonfinite"]["x"] == [1]
    assert history["nonfinite"]["y"] == [0.0]
    assert history["best"]["y"] == pytest.approx([0.3, 0.3, 0.35])
    section = browser.find_element("css selector", 'section[data-study="g1-contrastive"]')
    assert "3 complete, of them 1 scored 0 for a non-finite loss" in section.text
    row = section.find_element("css selector", 'table.trials tr[data-trial="1"]')
    assert "nonfinite" in row.get_attribute("class").split()
    assert "scored 0: non-finite" in row.find_element("css selector", "td:nth-child(2)").text
    assert row.find_element("css selector", "td.reason").get_attribute("textContent") == ZERO_REASON
    others = section.find_elements("css selector", "table.trials tr.nonfinite")
    assert len(others) == 1
    assert "black crosses" in section.text
    std, colours = png_std(full_page_png(browser))
    assert std > 20 and colours > 50
    assert severe(browser) == []


def test_one_complete_trial_degrades_to_notes(tmp_path):
    """Importance needs two complete trials: with one the page says so (no browser needed)."""
    import optuna

    from mlrc.report.dashboard import Dashboard

    url = f"sqlite:///{tmp_path / 'one.db'}"
    engine = store.connect(url)
    optuna.logging.set_verbosity(optuna.logging.WARNING)
    ostudy = optuna.create_study(study_name="one", storage=url, direction="maximize")
    dist = {"margin": optuna.distributions.FloatDistribution(0.0, 1.0)}
    ostudy.add_trial(
        optuna.trial.create_trial(params={"margin": 0.3}, distributions=dist, value=0.2)
    )
    with session(engine) as s:
        st = Study(
            name="one",
            dataset="glyphs",
            loss="triplet",
            strategy=None,
            preset="cpu",
            config={},
            code_version="test",
        )
        s.add(st)
        s.flush()
        s.add(
            Trial(
                study_id=st.id,
                number=0,
                params={"margin": 0.3},
                params_hash="m",
                state="complete",
                value=0.2,
                sem=0.01,
            )
        )
    page = Dashboard(url).page()
    assert "Hyperparameter importance: needs ≥ 2 complete trials (1 so far)." in page
    assert page.count("Plotly.newPlot(") == 3  # history, parallel coordinates, slice
    assert "No validated epoch yet." in page and "No test results yet" in page
