"""The deployment files: docker-compose.yml, workers/Dockerfile, .dockerignore and the workers'
GPU picker (workers/entrypoint.sh), checked statically, without Docker (docker compose, when
installed, also validates the file)."""

from __future__ import annotations

import json
import os
import re
import shutil
import subprocess
from pathlib import Path

import pytest
import yaml

REPO = Path(__file__).resolve().parents[2]
COMPOSE = REPO / "docker-compose.yml"
DOCKERFILE = REPO / "workers" / "Dockerfile"
ENTRYPOINT = REPO / "workers" / "entrypoint.sh"
README = REPO / "workers" / "README.md"
DOCKERIGNORE = REPO / ".dockerignore"

RAY = {"ray-head", "ray-worker"}
MLRC_SERVICES = {"worker", "ray-head", "ray-worker", "dashboard"}  # built from our image
GPU_SERVICES = {"worker", "ray-worker"}

# ${VAR}, ${VAR:-default}, ${VAR-default}, ${VAR:?message}, ${VAR?message}; $$ is a literal $.
VAR = re.compile(r"\$\{([A-Za-z_][A-Za-z0-9_]*)(?:(:?[-?])([^}]*))?\}")


def _strings(obj):
    if isinstance(obj, str):
        yield obj
    elif isinstance(obj, dict):
        for k, v in obj.items():
            yield from _strings(k)
            yield from _strings(v)
    elif isinstance(obj, list):
        for v in obj:
            yield from _strings(v)


def resolve(text: str) -> str:
    """The value compose gives `text` with every variable unset: defaults, `<VAR>` otherwise."""

    def sub(m: re.Match) -> str:
        op, arg = m.group(2), m.group(3)
        return arg if op in (":-", "-") else f"<{m.group(1)}>"

    return VAR.sub(sub, text.replace("$$", "\0")).replace("\0", "$")


def defaults(text: str, name: str) -> list[str]:
    return [m.group(3) for m in VAR.finditer(text) if m.group(1) == name and m.group(2) == ":-"]


@pytest.fixture(scope="module")
def compose() -> dict:
    return yaml.safe_load(COMPOSE.read_text())


@pytest.fixture(scope="module")
def services(compose) -> dict:
    return compose["services"]


def _environment(svc: dict) -> dict[str, str]:
    env = svc.get("environment") or {}
    if isinstance(env, list):
        env = dict(item.split("=", 1) if "=" in item else (item, "") for item in env)
    return {str(k): "" if v is None else str(v) for k, v in env.items()}


def _volumes(svc: dict) -> list[tuple[str, str, bool]]:
    """(source, target, read_only) of each volume entry, sources with defaults resolved."""
    out = []
    for v in svc.get("volumes", []):
        if isinstance(v, dict):
            out.append((resolve(str(v.get("source", ""))), v["target"], bool(v.get("read_only"))))
            continue
        parts = resolve(v).split(":")
        if len(parts) == 1:  # anonymous volume
            out.append(("", parts[0], False))
        else:
            out.append((parts[0], parts[1], len(parts) > 2 and "ro" in parts[2].split(",")))
    return out


def _is_path(source: str) -> bool:
    return source.startswith(("/", ".", "~"))


def _command(value) -> list[str]:
    if value is None:
        return []
    return value.split() if isinstance(value, str) else [str(x) for x in value]


# --- docker-compose.yml ------------------------------------------------------------------------


def test_compose_has_the_services_and_no_version_key(compose, services):
    assert "version" not in compose, "the compose spec has no `version:` key"
    assert {"postgres", "worker", "ray-head", "ray-worker", "dashboard"} <= set(services)


def test_profiles(services):
    for name in RAY:
        assert services[name].get("profiles") == ["ray"], name
    assert services["dashboard"].get("profiles") == ["dashboard"]
    for name in ("postgres", "worker"):  # started by a plain `docker compose up`
        assert not services[name].get("profiles"), name


def test_builds_exist_and_mlrc_services_build_workers_dockerfile(services):
    images = set()
    for name, svc in services.items():
        build = svc.get("build")
        if build is None:
            assert svc.get("image"), f"{name}: neither image nor build"
            assert name not in MLRC_SERVICES, f"{name} must build workers/Dockerfile"
            continue
        if isinstance(build, str):
            build = {"context": build}
        context = REPO / resolve(build.get("context", "."))
        assert context.is_dir(), f"{name}: build context {context} missing"
        dockerfile = (context / resolve(build.get("dockerfile", "Dockerfile"))).resolve()
        assert dockerfile.is_file(), f"{name}: {dockerfile} missing"
        assert dockerfile == DOCKERFILE, f"{name} builds {dockerfile}, not workers/Dockerfile"
        images.add(svc.get("image"))
    for name in MLRC_SERVICES:
        assert "build" in services[name], f"{name} must build workers/Dockerfile"
    assert len(images) == 1, f"the mlrc services build one image, got {images}"


def test_named_volumes_are_declared(compose, services):
    declared = set(compose.get("volumes") or {})
    for name, svc in services.items():
        for source, target, _ in _volumes(svc):
            if source and not _is_path(source):
                assert source in declared, f"{name}: volume {source} ({target}) not declared"


def test_bind_mount_sources_exist_or_are_documented(services):
    readme = README.read_text()
    for name, svc in services.items():
        for v in svc.get("volumes", []):
            raw = v.get("source", "") if isinstance(v, dict) else v.split(":")[0]
            if not _is_path(resolve(raw)):
                continue
            if "${" not in raw:  # a literal path of the repository
                assert (REPO / raw).exists(), f"{name}: bind source {raw} missing"
            for m in VAR.finditer(raw):
                assert f"`{m.group(1)}`" in readme, f"{m.group(1)} undocumented in workers/README"
                if m.group(2) == ":-":
                    assert f"`{m.group(3)}`" in readme, f"default {m.group(3)} undocumented"


def test_every_variable_is_documented(compose):
    readme = README.read_text()
    names = {m.group(1) for s in _strings(compose) for m in VAR.finditer(s)}
    assert {"MLRC_DB_PASSWORD", "MLRC_STUDY", "MLRC_WORKERS", "MLRC_DATA"} <= names
    for name in names:
        assert f"`{name}`" in readme, f"${{{name}}} is not documented in workers/README.md"


def test_postgres_has_healthcheck_and_volume(compose, services):
    pg = services["postgres"]
    assert "pg_isready" in " ".join(_command(pg["healthcheck"]["test"]))
    sources = {s: t for s, t, _ in _volumes(pg)}
    assert sources, "postgres keeps its data in a volume"
    assert "/var/lib/postgresql/data" in sources.values()
    assert all(not _is_path(s) and s in compose["volumes"] for s in sources)


def test_gpu_services_reserve_nvidia_gpus_and_mount_artifacts_and_data(compose, services):
    for name in GPU_SERVICES:
        svc = services[name]
        devices = svc["deploy"]["resources"]["reservations"]["devices"]
        assert any(d.get("driver") == "nvidia" and "gpu" in d["capabilities"] for d in devices)
        mounts = {t: (s, ro) for s, t, ro in _volumes(svc)}
        assert not _is_path(mounts["/artifacts"][0]), f"{name}: /artifacts is the shared volume"
        assert mounts["/artifacts"][0] in compose["volumes"]
        raw = [v for v in svc["volumes"] if isinstance(v, str) and ":/data" in v]
        assert raw and raw[0].startswith("${MLRC_DATA:-"), f"{name}: /data from MLRC_DATA"
        assert mounts["/data"][1], f"{name}: /data is read-only"
        assert _environment(svc).get("MLRC_ARTIFACTS") == "/artifacts"


def test_each_worker_gets_its_own_gpu(services):
    """Docker gives every replica reserving `count: 1` the same first GPU: the worker sees all
    GPUs and mlrc-one-gpu picks one under a lock kept in a per-host volume."""
    w = services["worker"]
    assert "MLRC_WORKERS" in str(w["deploy"]["replicas"])
    assert _command(w.get("entrypoint"))[:2] == ["mlrc-one-gpu", "mlrc"]
    locks = {t: s for s, t, _ in _volumes(w)}.get("/var/lib/mlrc/gpu-locks")
    assert locks and not _is_path(locks), "the GPU locks live in a named volume (per host)"
    command = _command(w["command"])
    assert command[0] == "worker"
    assert w["restart"] == "on-failure"
    assert w["depends_on"]["postgres"]["condition"] == "service_healthy"
    url = resolve(_environment(w)["MLRC_STORAGE"])
    assert url.startswith("postgresql+psycopg://") and url.endswith("@postgres:5432/mlrc")


def test_published_ports_bind_localhost_by_default(services):
    for name, svc in services.items():
        for p in svc.get("ports", []):
            if isinstance(p, dict):
                assert resolve(str(p.get("host_ip", ""))) == "127.0.0.1", f"{name}: {p}"
            else:
                assert resolve(str(p)).startswith("127.0.0.1:"), f"{name}: port {p}"


def test_credentials_come_from_the_environment(services):
    url_password = re.compile(r"://[^:/@\s]+:([^@\s]*)@")
    for name, svc in services.items():
        for key, value in _environment(svc).items():
            if "PASSWORD" in key:
                assert re.fullmatch(r"\$\{[A-Z_]+:?\?[^}]*\}", value), f"{name}: {key} literal"
            for m in url_password.finditer(value):
                assert re.fullmatch(r"\$\{[A-Z_]+:?\?[^}]*\}", m.group(1)), f"{name}: {key}"
        for s in _strings([svc.get("command"), svc.get("entrypoint")]):
            assert not url_password.search(resolve(s)), f"{name}: credentials in the command"


def test_ray_services(services):
    head, worker = services["ray-head"], services["ray-worker"]
    assert _command(head["entrypoint"]) == ["ray"] == _command(worker["entrypoint"])
    hc = _command(head["command"])
    assert hc[0] == "start" and "--head" in hc and "--block" in hc
    port = next(a.split("=", 1)[1] for a in hc if a.startswith("--port="))
    assert f"--address=ray-head:{port}" in _command(worker["command"])
    assert "--block" in _command(worker["command"])
    assert "8265" in " ".join(str(p) for p in head["ports"])


def test_dashboard_serves_the_study_database(services):
    d = services["dashboard"]
    cmd = " ".join(_command(d.get("entrypoint")) + _command(d.get("command")))
    assert "optuna-dashboard" in cmd and "MLRC_STORAGE" in cmd and "--port 8080" in cmd
    assert "MLRC_STORAGE" in _environment(d)
    assert [str(p) for p in d["ports"]] == ["127.0.0.1:8080:8080"]


def test_default_study_exists_and_reads_data_under_slash_data(compose, tmp_path):
    from mlrc.config import load_study

    found = {d for s in _strings(compose) for d in defaults(s, "MLRC_STUDY")}
    assert len(found) == 1, f"one default study for MLRC_STUDY, got {found}"
    study = REPO / found.pop()
    assert study.is_file(), study
    data = yaml.safe_load(study.read_text())
    root = data["dataset"]["root"]
    assert root.startswith("/data/"), f"{study}: dataset.root {root} is not under /data"
    data["dataset"]["root"] = str(tmp_path)  # the rest of the study must be valid as it is
    (tmp_path / "study.yaml").write_text(yaml.safe_dump(data))
    assert load_study(tmp_path / "study.yaml").study.name == data["name"]


def test_docker_compose_config():
    if shutil.which("docker") is None:
        pytest.skip("docker is not installed")
    probe = subprocess.run(["docker", "compose", "version"], capture_output=True, text=True)
    if probe.returncode != 0:
        pytest.skip("the docker compose plugin is not installed")
    env = {**os.environ, "MLRC_DB_PASSWORD": "test-only"}
    for profiles in ([], ["--profile", "ray", "--profile", "dashboard"]):
        r = subprocess.run(
            ["docker", "compose", *profiles, "-f", str(COMPOSE), "config", "-q"],
            cwd=REPO,
            env=env,
            capture_output=True,
            text=True,
        )
        assert r.returncode == 0, r.stderr


# --- workers/Dockerfile and .dockerignore ------------------------------------------------------


def _instructions() -> list[tuple[str, str]]:
    lines, current = [], ""
    for line in DOCKERFILE.read_text().splitlines():
        if not current and (not line.strip() or line.lstrip().startswith("#")):
            continue
        if line.lstrip().startswith("#"):  # a comment inside a continued instruction
            continue
        if line.rstrip().endswith("\\"):
            current += line.rstrip()[:-1] + " "
            continue
        lines.append(current + line)
        current = ""
    out = []
    for line in lines:
        op, _, rest = line.strip().partition(" ")
        out.append((op.upper(), rest.strip()))
    return out


def _copies() -> list[tuple[list[str], str]]:
    """(sources, destination) of every COPY/ADD from the build context."""
    out = []
    for op, rest in _instructions():
        if op not in ("COPY", "ADD"):
            continue
        args = json.loads(rest) if rest.startswith("[") else rest.split()
        flags = [a for a in args if a.startswith("--")]
        if any(f.startswith("--from") for f in flags):
            continue
        paths = [a for a in args if not a.startswith("--")]
        out.append((paths[:-1], paths[-1]))
    return out


def test_dockerfile_copies_existing_paths():
    copies = _copies()
    assert copies
    for sources, _ in copies:
        for src in sources:
            assert (REPO / src).exists(), f"COPY source {src} is not in the repository"


def test_dockerfile_base_entrypoint_and_user():
    ins = _instructions()
    args = dict(
        rest.split("=", 1) for op, rest in ins if op == "ARG" and "=" in rest and " " not in rest
    )
    base = next(rest for op, rest in ins if op == "FROM")
    base = re.sub(r"\$\{?(\w+)\}?", lambda m: args.get(m.group(1), m.group(0)), base)
    assert base.startswith("nvidia/cuda:"), f"a CUDA base image, got {base}"
    entry = [rest for op, rest in ins if op == "ENTRYPOINT"]
    assert entry and json.loads(entry[-1]) == ["mlrc"]
    users = [rest.split(":")[0] for op, rest in ins if op == "USER"]
    assert users and users[-1] not in ("root", "0"), f"runs as {users[-1:] or 'root'}"


def test_dockerfile_installs_mlrc_with_its_extras():
    runs = " ".join(rest for op, rest in _instructions() if op == "RUN")
    installs = re.findall(r"pip install ([^&;|]*)", runs)
    extras = [
        set(m.group(1).split(","))
        for line in installs
        for m in re.finditer(r"""["']?\.\[([\w,-]+)\]["']?""", line)
    ]
    assert extras, "pip install .[...] of the project"
    assert "postgres" in extras[0] and "dashboard" in extras[0], extras[0]
    # editable: mlrc.config reads studies/presets and studies/spaces beside the package
    assert all(re.search(r"(^|\s)-e\s", line) for line in installs if re.search(r"\s\.", line))
    assert any("ray[default]" in line for line in installs), "ray start / the Ray dashboard"
    assert "studies/" in {s for srcs, _ in _copies() for s in srcs}


def test_worker_entrypoint_is_installed_on_the_path(services):
    name = _command(services["worker"].get("entrypoint"))[0]
    dests = {dest: srcs for srcs, dest in _copies()}
    assert f"/usr/local/bin/{name}" in dests, f"{name} is not installed by the Dockerfile"
    assert dests[f"/usr/local/bin/{name}"] == ["workers/entrypoint.sh"]


def _ignore_patterns() -> list[str]:
    return [
        ln.strip()
        for ln in DOCKERIGNORE.read_text().splitlines()
        if ln.strip() and not ln.lstrip().startswith("#")
    ]


def _pattern_regex(pattern: str) -> re.Pattern:
    out, i = "", 0
    while i < len(pattern):
        if pattern.startswith("**/", i):
            out, i = out + "(?:.*/)?", i + 3
        elif pattern.startswith("**", i):
            out, i = out + ".*", i + 2
        elif pattern[i] == "*":
            out, i = out + "[^/]*", i + 1
        elif pattern[i] == "?":
            out, i = out + "[^/]", i + 1
        elif pattern[i] == "[":
            j = pattern.index("]", i)
            out, i = out + pattern[i : j + 1], j + 1
        else:
            out, i = out + re.escape(pattern[i]), i + 1
    return re.compile(out)


def _ignored(path: str, patterns: list[str]) -> bool:
    parts = path.strip("/").split("/")
    prefixes = ["/".join(parts[: k + 1]) for k in range(len(parts))]
    ignored = False
    for p in patterns:
        negate = p.startswith("!")
        rx = _pattern_regex(p.lstrip("!").strip("/"))
        if any(rx.fullmatch(prefix) for prefix in prefixes):
            ignored = not negate
    return ignored


def test_dockerignore_excludes_the_bulk_but_not_what_the_image_copies():
    patterns = _ignore_patterns()
    for path in (".venv/bin/python", ".git/HEAD", "mlrc-artifacts/x/last.pt", "mlrc.db"):
        assert _ignored(path, patterns), f"{path} is sent to the docker daemon"
    for path in ("bench/results/run.csv", "mlrc/__pycache__/cli.cpython-311.pyc", "data/x.jpg"):
        assert _ignored(path, patterns), path
    sources = [s for srcs, _ in _copies() for s in srcs]
    listed = subprocess.run(
        ["git", "ls-files", "--", *sources], cwd=REPO, capture_output=True, text=True
    ).stdout.split()
    for path in listed or sources:
        assert not _ignored(path, patterns), f".dockerignore drops {path}, which the image copies"


def test_ignore_matcher_can_say_no():
    assert not _ignored("mlrc/cli.py", ["**/*.pyc", "data", ".git"])
    assert _ignored("a/b/c.pyc", ["**/*.py[cod]"])
    assert not _ignored("x.db", ["*.db", "!x.db"])


# --- workers/entrypoint.sh: one GPU per worker ---------------------------------------------------


@pytest.fixture
def picker(tmp_path):
    if shutil.which("bash") is None or shutil.which("flock") is None:
        pytest.skip("bash and flock (util-linux) are needed to run workers/entrypoint.sh")
    bin_dir = tmp_path / "bin"
    bin_dir.mkdir()
    env = {
        **os.environ,
        "PATH": f"{bin_dir}{os.pathsep}{os.environ['PATH']}",
        "MLRC_GPU_LOCKS": str(tmp_path / "locks"),
        "_MLRC_DEV_DIR": str(tmp_path / "dev"),
    }
    env.pop("CUDA_VISIBLE_DEVICES", None)
    env.pop("MLRC_DEVICE", None)

    def fake_gpus(*uuids: str) -> None:
        smi = bin_dir / "nvidia-smi"
        smi.write_text("#!/bin/sh\n" + "".join(f"echo {u}\n" for u in uuids))
        smi.chmod(0o755)

    def start(*cmd: str) -> subprocess.Popen:
        return subprocess.Popen(
            ["bash", str(ENTRYPOINT), *cmd],
            env=env,
            stdin=subprocess.PIPE,
            stdout=subprocess.PIPE,
            stderr=subprocess.PIPE,
            text=True,
        )

    return env, fake_gpus, start, tmp_path


SHOW = 'echo "$CUDA_VISIBLE_DEVICES $MLRC_DEVICE"; read -r _'  # holds its GPU until stdin closes


def test_entrypoint_gives_each_worker_a_free_gpu(picker):
    _, fake_gpus, start, _ = picker
    fake_gpus("GPU-aaa", "GPU-bbb")
    first = start("sh", "-c", SHOW)
    assert first.stdout.readline().split() == ["GPU-aaa", "cuda"]
    second = start("sh", "-c", SHOW)
    assert second.stdout.readline().split() == ["GPU-bbb", "cuda"]
    third = start("sh", "-c", "echo ran")
    out, err = third.communicate(timeout=30)
    assert third.returncode == 0 and out == "", "a replica without a free GPU runs nothing"
    assert "all 2 GPUs" in err
    first.communicate("\n", timeout=30)  # the first worker exits: its GPU is free again
    again = start("sh", "-c", "echo $CUDA_VISIBLE_DEVICES")
    assert again.communicate(timeout=30)[0].strip() == "GPU-aaa"
    second.communicate("\n", timeout=30)
    assert first.returncode == 0 and second.returncode == 0


def test_entrypoint_without_nvidia_smi_uses_the_device_nodes(picker):
    _, _, start, tmp_path = picker
    dev = tmp_path / "dev"
    dev.mkdir()
    for node in ("nvidia10", "nvidia3", "nvidiactl", "nvidia-uvm"):
        (dev / node).touch()
    first = start("sh", "-c", SHOW)
    assert first.stdout.readline().split() == ["0", "cuda"]  # nvidia3: the first visible GPU
    second = start("sh", "-c", "echo $CUDA_VISIBLE_DEVICES")
    assert second.communicate(timeout=30)[0].strip() == "1"
    first.communicate("\n", timeout=30)
    assert sorted(p.name for p in (tmp_path / "locks").iterdir()) == [
        "nvidia10.lock",
        "nvidia3.lock",
    ]


def test_entrypoint_without_any_gpu_fails_with_a_reason(picker):
    _, _, start, _ = picker
    p = start("true")
    _, err = p.communicate(timeout=30)
    assert p.returncode == 1 and "no GPU visible" in err
