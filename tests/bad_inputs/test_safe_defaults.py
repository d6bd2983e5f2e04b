"""Safe defaults, checked as properties of the whole code base (issue #8, "Robustness"):

(a) checkpoints and weights are loaded with ``torch.load(weights_only=True)`` and YAML with a
    safe loader: an AST scan of every module of ``mlrc``, plus files that would run code if they
    were unpickled or constructed unsafely (they must be refused and run nothing);
(b) servers bind to 127.0.0.1 unless told otherwise: every host option of every ``mlrc``
    command; a local Ray starts no dashboard. The published ports of docker-compose.yml are
    checked in tests/config/test_compose.py (``test_published_ports_bind_localhost_by_default``);
(c) credentials are never printed: every command that opens the store, given a URL with a
    password that the server refuses, prints one line without it and logs nothing with it; no
    message formats a database URL without :func:`mlrc.store.redact`;
(d) names never escape a folder: study and campaign names that could (``../x``, ``a/b``,
    absolute, NUL, newline, longer than a file name) are refused at validation, names derived
    for a campaign's studies are sanitised, and names read from the store never become paths.
"""

from __future__ import annotations

import ast
import functools
import importlib
import json
import logging
import os
import re
from collections.abc import Iterator
from pathlib import Path

import pytest
import yaml
from typer.testing import CliRunner

from mlrc.cli import app
from mlrc.store.engine import session
from mlrc.store.schema import Study

PACKAGE = Path(__file__).resolve().parents[2] / "mlrc"
PASSWORD = "Sd-s3cret-4k"  # the role's real password
WRONG = "Sd-wr0ng-8m"  # what the user typed: neither may ever be shown
ROLE = "safedef_pw"
runner = CliRunner()


@functools.cache
def modules() -> tuple[tuple[str, ast.Module], ...]:
    """(dotted module name, AST) of every module of the mlrc package (parsed once)."""
    found = []
    for path in sorted(PACKAGE.rglob("*.py")):
        parts = path.relative_to(PACKAGE.parent).with_suffix("").parts
        name = ".".join(parts[:-1] if parts[-1] == "__init__" else parts)
        found.append((name, ast.parse(path.read_text(encoding="utf-8"), str(path))))
    return tuple(found)


def dotted(node: ast.expr) -> str | None:
    """``a.b.c`` for a chain of attributes on a name, else None."""
    if isinstance(node, ast.Name):
        return node.id
    if isinstance(node, ast.Attribute):
        base = dotted(node.value)
        return f"{base}.{node.attr}" if base else None
    return None


@functools.cache
def _calls(tree: ast.AST) -> dict[str, list[ast.Call]]:
    found: dict[str, list[ast.Call]] = {}
    for node in ast.walk(tree):
        if isinstance(node, ast.Call) and (name := dotted(node.func)):
            found.setdefault(name, []).append(node)
    return found


def calls(tree: ast.AST, name: str) -> list[ast.Call]:
    """Calls of ``name`` (e.g. ``torch.load``) written as that attribute chain."""
    return _calls(tree).get(name, [])


def keyword(call: ast.Call, name: str) -> ast.expr | None:
    return next((k.value for k in call.keywords if k.arg == name), None)


def is_true(node: ast.expr | None) -> bool:
    return isinstance(node, ast.Constant) and node.value is True


def where(module: str, node: ast.AST) -> str:
    return f"{module}:{node.lineno}: {ast.unparse(node)}"


# --- (a) deserialisation -------------------------------------------------------------------------


def test_every_torch_load_is_weights_only():
    """``torch.load`` and torch.hub's download both unpickle: only with ``weights_only=True``."""
    found, unsafe = 0, []
    for module, tree in modules():
        for fn in ("torch.load", "torch.hub.load_state_dict_from_url"):
            for call in calls(tree, fn):
                found += 1
                if not is_true(keyword(call, "weights_only")):
                    unsafe.append(where(module, call))
    assert found >= 3, "the scan found too few torch.load calls: is it still looking?"
    assert unsafe == [], "torch.load without weights_only=True:\n" + "\n".join(unsafe)


def test_nothing_else_unpickles():
    unsafe = []
    for module, tree in modules():
        for fn in ("pickle.load", "pickle.loads", "dill.load", "joblib.load", "torch.jit.load"):
            unsafe += [where(module, c) for c in calls(tree, fn)]
        for call in calls(tree, "np.load") + calls(tree, "numpy.load"):
            allow = keyword(call, "allow_pickle")  # numpy's default: False
            if allow is not None and not (isinstance(allow, ast.Constant) and allow.value is False):
                unsafe.append(where(module, call))
    assert unsafe == [], "\n".join(unsafe)


def _safe_loader(module: str, node: ast.expr | None) -> bool:
    """Is the ``Loader=`` of a yaml.load call a safe loader (no Python object construction)?"""
    if node is None:
        return False
    if isinstance(node, ast.Attribute) and ast.unparse(node.value) == "yaml":
        loader = getattr(yaml, node.attr, None)
    elif isinstance(node, ast.Name):
        loader = getattr(importlib.import_module(module), node.id, None)
    else:
        return False
    return (
        isinstance(loader, type)
        and issubclass(loader, yaml.constructor.SafeConstructor)
        and not issubclass(loader, yaml.constructor.FullConstructor)
    )


def test_yaml_is_only_loaded_with_a_safe_loader():
    unsafe, found = [], 0
    for module, tree in modules():
        for fn in (
            "yaml.unsafe_load",
            "yaml.unsafe_load_all",
            "yaml.full_load",
            "yaml.full_load_all",
        ):
            unsafe += [where(module, c) for c in calls(tree, fn)]
        for fn in ("yaml.load", "yaml.load_all"):
            for call in calls(tree, fn):
                found += 1
                loader = keyword(call, "Loader") or (call.args[1] if len(call.args) > 1 else None)
                if not _safe_loader(module, loader):
                    unsafe.append(where(module, call))
        for fn in ("yaml.safe_load", "yaml.safe_load_all"):
            found += len(list(calls(tree, fn)))
        for node in ast.walk(tree):
            if isinstance(node, ast.Attribute) and dotted(node) in (
                "yaml.Loader",
                "yaml.UnsafeLoader",
                "yaml.FullLoader",
                "yaml.CLoader",
                "yaml.CUnsafeLoader",
                "yaml.CFullLoader",
            ):
                unsafe.append(where(module, node))
    assert found >= 1, "the scan found no YAML loading: is it still looking?"
    assert unsafe == [], "YAML loaded without a safe loader:\n" + "\n".join(unsafe)


def test_a_study_file_that_would_run_code_is_refused(tmp_path, monkeypatch):
    monkeypatch.chdir(tmp_path)
    marker = tmp_path / "ran"
    study = tmp_path / "evil.yaml"
    study.write_text(
        f"name: !!python/object/apply:os.system ['touch {marker}']\n"
        "dataset: {name: glyphs}\nloss: {name: contrastive}\n"
    )
    r = runner.invoke(app, ["study", "run", str(study), "--storage", f"sqlite:///{tmp_path}/db"])
    assert r.exit_code == 2, r.output
    assert len(r.stderr.splitlines()) == 1 and r.stderr.startswith(f"error: {study}: ")
    assert not marker.exists()


class _RunsCode:
    """Unpickling this (without weights_only) would create the file ``path``."""

    def __init__(self, path: Path) -> None:
        self.path = path

    def __reduce__(self):
        return (open, (str(self.path), "w"))


def test_a_weights_file_that_would_run_code_is_refused(tmp_path):
    import torch
    from torch import nn

    from mlrc.models.weights import load_weights

    marker, weights = tmp_path / "ran", tmp_path / "evil.pth"
    torch.save({"weight": _RunsCode(marker)}, weights)
    with pytest.raises(ValueError, match=f"weights file {re.escape(str(weights))} is not a "):
        load_weights(nn.Linear(2, 2), weights, "", "")
    assert not marker.exists()


# --- (b) binding ---------------------------------------------------------------------------------


def commands(group=None, path: tuple[str, ...] = ()) -> Iterator[tuple[str, object]]:
    """(``mlrc SUB COMMAND``, click command) for every command, through every sub-group."""
    import typer.main

    group = group or typer.main.get_command(app)
    for name, cmd in group.commands.items():
        if hasattr(cmd, "commands"):
            yield from commands(cmd, (*path, name))
        else:
            yield " ".join(("mlrc", *path, name)), cmd


def test_every_host_option_defaults_to_localhost():
    hosts = {}
    for name, cmd in commands():
        for p in cmd.params:
            if re.search(r"host|bind|listen|interface", p.name):
                hosts[f"{name} --{p.name}"] = p.default
    assert "mlrc dashboard serve --host" in hosts, "the scan missed the dashboard's --host"
    assert {k: v for k, v in hosts.items() if v != "127.0.0.1"} == {}


def _localhost(default: ast.expr | None) -> bool:
    """No default (the caller says), or 127.0.0.1."""
    return default is None or (isinstance(default, ast.Constant) and default.value == "127.0.0.1")


def test_servers_made_in_code_default_to_localhost():
    """Every function parameter named like a host has 127.0.0.1 as its default, no literal binds
    every interface, and a local Ray (``ray.init``) starts no dashboard."""
    wrong = []
    for module, tree in modules():
        for node in ast.walk(tree):
            if isinstance(node, ast.FunctionDef | ast.AsyncFunctionDef):
                positional = node.args.posonlyargs + node.args.args
                args = positional + node.args.kwonlyargs
                defaults = [None] * (len(positional) - len(node.args.defaults))
                defaults += node.args.defaults + node.args.kw_defaults
                for arg, default in zip(args, defaults, strict=True):
                    if re.search(r"host|bind", arg.arg) and not _localhost(default):
                        wrong.append(f"{module}:{node.lineno}: {node.name}({arg.arg}=...)")
            if isinstance(node, ast.Constant) and node.value in ("0.0.0.0", "::"):
                wrong.append(where(module, node))
        for call in calls(tree, "ray.init"):
            dashboard = keyword(call, "include_dashboard")
            host = keyword(call, "dashboard_host")
            off = isinstance(dashboard, ast.Constant) and dashboard.value is False
            local = isinstance(host, ast.Constant) and host.value == "127.0.0.1"
            if not (off or local):
                wrong.append(where(module, call))
    assert wrong == [], "\n".join(wrong)


# --- (c) credentials -----------------------------------------------------------------------------


@pytest.fixture(scope="module")
def role_url(postgres_server) -> str:
    """A database whose owner must give PASSWORD over TCP; its URL without a password."""
    return postgres_server.password_role(ROLE, PASSWORD)


@pytest.fixture
def refused_url(role_url) -> str:
    """A URL with a password that the server refuses."""
    return role_url.replace(f"//{ROLE}@", f"//{ROLE}:{WRONG}@", 1)


def _study_and_campaign(tmp_path: Path) -> tuple[Path, Path]:
    study, campaign = tmp_path / "s.yaml", tmp_path / "c.yaml"
    study.write_text(
        json.dumps({"name": "s", "dataset": {"name": "glyphs"}, "loss": {"name": "contrastive"}})
    )
    campaign.write_text(
        json.dumps({"name": "c", "datasets": ["glyphs"], "losses": ["contrastive"]})
    )
    return study, campaign


def test_no_command_prints_or_logs_the_password(refused_url, tmp_path, monkeypatch, caplog):
    monkeypatch.chdir(tmp_path)
    caplog.set_level(logging.DEBUG)
    study, campaign = _study_and_campaign(tmp_path)
    shown = refused_url.replace(WRONG, "***")
    storage = ["--storage", refused_url]
    for args in (
        ["report"],
        ["study", "status", "s"],
        ["study", "run", str(study)],
        ["study", "test", str(study)],
        ["worker", str(study)],
        ["campaign", "run", str(campaign)],
        ["campaign", "status", "c"],
        ["dashboard", "build", "--out", str(tmp_path / "d.html")],
        ["dashboard", "serve", "--port", "0"],
    ):
        r = runner.invoke(app, [*args, *storage])
        assert r.exit_code == 2, (args, r.output, r.exception)
        assert len(r.stderr.splitlines()) == 1 and r.stdout == "", (args, r.output)
        assert r.stderr.startswith(f"error: {shown}: cannot connect ("), (args, r.stderr)
        assert WRONG not in r.output and PASSWORD not in r.output, args
    for rec in caplog.records:
        assert WRONG not in rec.getMessage() and PASSWORD not in rec.getMessage()
    assert sorted(p.name for p in tmp_path.iterdir()) == ["c.yaml", "s.yaml"]  # nothing written


@pytest.mark.parametrize("spelling", ["password-in-query", "unescaped-at"])
def test_other_spellings_of_a_password_are_hidden_too(role_url, spelling):
    if spelling == "password-in-query":  # libpq reads it there too
        url = f"{role_url}?password={WRONG}"
    else:  # '@' not percent-encoded: SQLAlchemy would take the rest for the host
        url = role_url.replace(f"//{ROLE}@", f"//{ROLE}:{WRONG[:3]}@{WRONG[3:]}@", 1)
    r = runner.invoke(app, ["report", "--storage", url])
    assert r.exit_code == 2 and len(r.stderr.splitlines()) == 1 and r.stdout == "", r.output
    assert WRONG not in r.output and WRONG[3:] not in r.output


DB_URL_NAMES = {"storage", "url", "db_url", "database_url"}
LOGGED = {"debug", "info", "warning", "error", "exception", "print", "echo"}
# ``url`` there is a public download URL (datasets, trunk weights), not a database's
NOT_DB_URLS = {"mlrc.data.download", "mlrc.models.weights"}


def test_no_message_shows_a_database_url_unredacted():
    """Formatting ``storage``/``url`` into a string or a log call shows its password: every
    message goes through ``redact(...)`` (which a formatted call, not a bare name, is)."""
    shown = []
    for module, tree in modules():
        if module in NOT_DB_URLS or module.startswith("mlrc.store"):
            continue
        for node in ast.walk(tree):
            if isinstance(node, ast.FormattedValue) and _is_db_url(node.value):
                shown.append(f"{module}:{node.lineno}: f-string shows {ast.unparse(node.value)}")
            if isinstance(node, ast.Call) and getattr(node.func, "attr", None) in LOGGED:
                shown += [
                    f"{module}:{node.lineno}: {ast.unparse(node)}"
                    for a in node.args
                    if _is_db_url(a)
                ]
    assert shown == [], "\n".join(shown)


def _is_db_url(node: ast.expr) -> bool:
    return (isinstance(node, ast.Name) and node.id in DB_URL_NAMES) or (
        isinstance(node, ast.Attribute) and node.attr in DB_URL_NAMES
    )


# --- (d) names and paths -------------------------------------------------------------------------

ESCAPING = ["../x", "..", ".", "a/b", "/abs", "a\\b", "a\x00b", "a\nb", "x\n", "", "x" * 256]


@pytest.mark.parametrize("name", ESCAPING, ids=lambda n: repr(n)[:12])
@pytest.mark.parametrize("kind", ["study", "campaign"])
def test_names_that_could_escape_a_folder_are_refused(tmp_path, monkeypatch, name, kind):
    """Refused at validation: exit 2, one line naming the file and the key, nothing created."""
    monkeypatch.setattr("mlrc.store.connect", lambda *a, **k: pytest.fail("passed validation"))
    study, campaign = _study_and_campaign(tmp_path)
    path = study if kind == "study" else campaign
    path.write_text(json.dumps({**json.loads(path.read_text()), "name": name}))
    db = tmp_path / "db"
    r = runner.invoke(app, [kind, "run", str(path), "--storage", f"sqlite:///{db}"])
    assert r.exit_code == 2, (r.output, r.exception)
    assert len(r.stderr.splitlines()) == 1 and r.stderr.startswith(f"error: {path}: name: ")
    assert not db.exists()


def test_valid_names_are_one_path_component():
    from mlrc.config import StudyConfig

    for name in ("a..b", "x.", "A-_.9", "x" * 100):
        cfg = StudyConfig.model_validate(
            {"name": name, "dataset": {"name": "glyphs"}, "loss": {"name": "contrastive"}}
        )
        assert Path(cfg.name).name == cfg.name and cfg.name not in (".", "..")


def test_campaign_study_names_from_labels_are_sanitised():
    from mlrc.search.campaign_runner import NAME_PATTERN, study_name

    for parts in (
        ("c", "../../etc", "a/b", "/abs\x00\n"),
        ("c", "..", "..", None),
        ("c", "", " ", "\\"),
    ):
        name = study_name(*parts)
        assert re.fullmatch(NAME_PATTERN.removesuffix("$"), name), name
        assert Path(name).name == name and "/" not in name, name


def outside(folder: Path) -> list[str]:
    """What ``folder`` holds, but the store's own files."""
    return sorted(n for n in os.listdir(folder) if not n.startswith("store.db"))


def test_names_read_from_the_store_never_become_paths(tmp_path, monkeypatch):
    """A store may hold names no study file could give (written by hand, another version):
    reports and dashboards write only the file they are given, and escape names in HTML."""
    from mlrc import store

    work = tmp_path / "work"
    work.mkdir()
    monkeypatch.chdir(work)
    url = f"sqlite:///{tmp_path / 'store.db'}"
    engine = store.connect(url)
    with session(engine) as s:
        for name in ("../escape", str(tmp_path / "absolute"), "a/b", "<script>x</script>"):
            s.add(
                Study(
                    name=name,
                    dataset="glyphs",
                    loss="contrastive",
                    strategy=None,
                    preset="cpu",
                    config={},
                    code_version="t",
                )
            )
    engine.dispose()
    before = outside(tmp_path)
    r = runner.invoke(app, ["dashboard", "build", "--out", "page.html", "--storage", url])
    assert r.exit_code == 0, r.output
    for fmt in ("md", "html", "csv", "latex"):
        r = runner.invoke(app, ["report", "--storage", url, "--format", fmt, "--out", f"r.{fmt}"])
        assert r.exit_code == 0, r.output
    assert sorted(os.listdir(work)) == ["page.html", "r.csv", "r.html", "r.latex", "r.md"]
    assert outside(tmp_path) == before
    for page in ("page.html", "r.html"):
        assert "<script>x" not in (work / page).read_text(encoding="utf-8")
