"""The wheels a GPU machine without network needs for ``bench/gpu_check.sh`` (run by
``bench/gpu_wheels.sh``; standard library and pip only, so any Python 3 with pip runs it).

    python3 bench/gpu_wheels.py --python 3.12 [--out bench/gpu_wheels]   # from the lock
    .venv/bin/python bench/gpu_wheels.py --lock                          # rewrite the lock

The lock, ``bench/gpu_wheels.lock``, holds one exact ``name==version`` line per distribution
that the fold path imports (``mlrc.config``, ``mlrc.data``, ``mlrc.models``, ``mlrc.methods``,
``mlrc.protocol``, ``mlrc.train``), transitive ones included, as found by importing them in an
environment where mlrc is installed (``--lock``), plus what the check's own scripts import
(pandas and rich for ``bench/gpu_fold.py``, pytest for the GPU tests).

A locked distribution is not carried when the GPU image has it (``bench/gpu_image.txt``, the
image's packages as the device notes list them) at a compatible version: a known one of the
same major release (0.x: the same minor), or an unknown one — unless a carried wheel asks
for a floor (``>=``) of it: then the lock's version is carried too, and the check installs it
only where the machine's own is older. torch, torchvision, torchaudio, triton and
the CUDA libraries are never carried: the machine's own are used. mlrc itself travels as
source (the checkout is on the parts' PYTHONPATH). Fails when the folder would hold two
versions of one distribution, or 20 MB or more.
"""

from __future__ import annotations

import argparse
import importlib.metadata as md
import re
import subprocess
import sys
import time
from pathlib import Path

BENCH = Path(__file__).resolve().parent
LOCK = BENCH / "gpu_wheels.lock"
IMAGE = BENCH / "gpu_image.txt"
LIMIT_BYTES = 20 * 1000 * 1000
NEVER = ("torch", "torchvision", "torchaudio", "triton")  # and nvidia-*, cuda-*: the machine's
FOLD_PATH = ("mlrc.config", "mlrc.data", "mlrc.models", "mlrc.methods", "mlrc.protocol")
FOLD_PATH += ("mlrc.train", "mlrc.train.loop")
CHECK_NEEDS = ("pandas", "rich", "pytest")  # bench/gpu_fold.py's report; the GPU tests
PLATFORMS = ("manylinux_2_28_x86_64", "manylinux_2_17_x86_64", "manylinux2014_x86_64")


def norm(name: str) -> str:
    """A distribution's name as PEP 503 compares them."""
    return re.sub(r"[-_.]+", "-", name).lower()


def locked_now() -> dict[str, str]:
    """name → version of every distribution the fold path and the check import here."""
    import importlib

    for module in (*FOLD_PATH, *CHECK_NEEDS):
        importlib.import_module(module)
    owners = md.packages_distributions()
    found: dict[str, str] = {}
    for module in list(sys.modules):
        for dist in owners.get(module.partition(".")[0], []):
            if norm(dist) != "mlrc":
                found[norm(dist)] = md.version(dist)
    return dict(sorted(found.items()))


def read_pins(path: Path) -> dict[str, str | None]:
    """``name==version`` (or a bare ``name``) lines; # comments."""
    pins: dict[str, str | None] = {}
    for raw in path.read_text().splitlines():
        text = raw.split("#", 1)[0].strip()
        if text:
            name, _, version = text.partition("==")
            pins[norm(name)] = version.strip() or None
    return pins


def same_release(a: str, b: str) -> bool:
    """Same major version (0.x: same minor)."""
    pa, pb = a.split("."), b.split(".")
    return pa[:2] == pb[:2] if pa[0] == "0" else pa[0] == pb[0]


def download(pins: dict[str, str], python: str, out: Path) -> None:
    """Binary wheels of exactly these versions for CPython ``python`` on x86-64 Linux."""
    cmd = [sys.executable, "-m", "pip", "download", "-q", "--no-deps", "--only-binary=:all:"]
    cmd += ["-d", str(out), "--python-version", python, "--implementation", "cp"]
    for platform in PLATFORMS:
        cmd += ["--platform", platform]
    subprocess.run([*cmd, *(f"{n}=={v}" for n, v in pins.items())], check=True)


def wheel_name(path: Path) -> tuple[str, str, bool]:
    """(distribution, version, pure Python) of a wheel file."""
    parts = path.name[: -len(".whl")].split("-")
    return norm(parts[0]), parts[1], parts[-1] == "any" and parts[-2] == "none"


def to_carry(pins: dict[str, str], image: dict[str, str | None]) -> tuple[dict, list[str]]:
    """The pins to carry, and what is left to the image (each with why)."""
    keep, left = {}, []
    for name, version in pins.items():
        if name in NEVER or name.startswith(("nvidia-", "cuda-")):
            left.append(f"{name} (the machine's own)")
        elif name in image and (image[name] is None or same_release(image[name], version)):
            left.append(f"{name} (image: {image[name] or 'its own version'})")
        else:
            keep[name] = version
    return keep, left


def floored(out: Path) -> set[str]:
    """Distributions the wheels in ``out`` require with a lower bound (``>=``), extras aside."""
    import zipfile

    names = set()
    for wheel in out.glob("*.whl"):
        with zipfile.ZipFile(wheel) as z:
            meta = next(n for n in z.namelist() if n.endswith(".dist-info/METADATA"))
            for line in z.read(meta).decode().splitlines():
                m = re.match(r"Requires-Dist: ([A-Za-z0-9_.-]+)\s*\(?\s*>=", line)
                if m and "extra ==" not in line:
                    names.add(norm(m.group(1)))
    return names


def check_folder(out: Path) -> int:
    """One version of each distribution, under the size limit; the bytes."""
    seen: dict[str, str] = {}
    for wheel in out.glob("*.whl"):
        name, version, _ = wheel_name(wheel)
        if seen.setdefault(name, version) != version:
            raise SystemExit(
                f"gpu_wheels: two versions of {name} in {out}: {seen[name]}, {version}"
            )
    size = sum(w.stat().st_size for w in out.glob("*.whl"))
    if size >= LIMIT_BYTES:
        raise SystemExit(f"gpu_wheels: {out} holds {size / 1e6:.1f} MB, over the 20 MB limit")
    return size


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--python", default="3.12", help="the GPU machine's Python, X.Y (3.12)")
    ap.add_argument("--out", type=Path, default=BENCH / "gpu_wheels")
    ap.add_argument("--lock", action="store_true", help=f"rewrite {LOCK.name} from this Python")
    args = ap.parse_args(argv)
    if args.lock:
        pins = locked_now()
        head = f"# bench/gpu_wheels.py --lock, {time.strftime('%Y-%m-%d')}: the fold path's\n"
        LOCK.write_text(head + "".join(f"{n}=={v}\n" for n, v in pins.items()))
        print(f"{LOCK}: {len(pins)} distributions")
        return 0
    if not re.fullmatch(r"3\.\d+", args.python):
        raise SystemExit(f"gpu_wheels: --python {args.python}: expected X.Y, e.g. 3.12")
    pins = {n: v for n, v in read_pins(LOCK).items() if v}
    args.out.mkdir(parents=True, exist_ok=True)
    for old in args.out.glob("*.whl"):
        old.unlink()
    image = read_pins(IMAGE)
    keep, dropped = to_carry(pins, image)
    download(keep, args.python, args.out)
    floors = {n: pins[n] for n in floored(args.out) if n in pins and n not in keep}
    floors = {n: v for n, v in floors.items() if n in image and image[n] is None}
    if floors:
        download(floors, args.python, args.out)
        dropped = [d for d in dropped if d.split(" ")[0] not in floors]
    size = check_folder(args.out)
    names = sorted(w.name for w in args.out.glob("*.whl"))
    (args.out / "MANIFEST.txt").write_text(
        f"# bench/gpu_wheels.py for Python {args.python}, {time.strftime('%Y-%m-%d')}\n"
        + "".join(f"{n}\n" for n in names)
    )
    print(f"{args.out}: {len(names)} wheels, {size / 1e6:.1f} MB, for Python {args.python}")
    print("left to the GPU machine: " + ", ".join(dropped))
    print("bash bench/gpu_check.sh installs them there; by hand:")
    print(
        "python3 -m pip install -q --no-index --no-deps --no-compile --target /tmp/site "
        f"{args.out.relative_to(Path.cwd()) if args.out.is_relative_to(Path.cwd()) else args.out}"
        "/*.whl && export PYTHONPATH=/tmp/site:$PWD"
    )
    return 0


if __name__ == "__main__":
    sys.exit(main())
