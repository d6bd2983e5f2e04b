"""The datasets read from files: loaders for the on-disk layouts that the official dataset
archives unpack to (CUB-200-2011, Cars196, Stanford Online Products, In-Shop, Omniglot) and the
generic class-folder layout (``image_folder``).

Every loader returns an ``ImageDataset`` with labels 0..C−1 in the class order the MLRC protocol
uses (so "first half of the classes" means the same classes as in the paper). They are grouped
in one module, by source (files on disk), because they share the path checks (an annotation may
not lead out of its root) and the class-folder and annotation-table readers; the synthetic
``glyphs`` registers in :mod:`mlrc.data.glyphs`. The registry is :mod:`mlrc.data.base`'s.
"""

from __future__ import annotations

import csv
import zipfile
from pathlib import Path, PurePosixPath

import numpy as np

from mlrc.data.base import (
    IMAGE_EXTENSIONS,
    ROLES,
    DatasetError,
    ImageDataset,
    bad_file,
    check_image_files,
    is_hidden,
    list_images,
    register,
    renumber,
    require_dir,
    require_file,
)
from mlrc.data.download import fetch_omniglot


def _root(root: str | Path | None, name: str) -> Path:
    if root is None:
        raise DatasetError(f"dataset {name!r} needs a root directory (its dataset root: PATH)")
    return require_dir(Path(root).expanduser(), f"{name} root")


def _inside(root: Path, rel: str, listed_in: Path) -> str:
    """Resolve an annotation path under ``root``; refuse one that escapes it.

    ``..``, absolute paths and symlinks (to a file or a folder) that lead out of ``root`` are
    refused: an annotation file may only name images inside its dataset.
    """
    try:
        p = (root / rel).resolve()
    except (OSError, RuntimeError, ValueError) as e:  # symlink loop, NUL byte
        raise DatasetError(f"{listed_in}: path {rel!r} cannot be resolved ({e})") from None
    if not p.is_relative_to(root.resolve()):
        raise DatasetError(
            f"{listed_in}: path {rel!r} points outside the dataset root {root} "
            f"(resolves to {p}); refused"
        )
    return str(p)


def _class_folders(folder: Path) -> list[Path]:
    """Sub-folders of ``folder`` sorted by name, hidden ones (``.git``, ``__MACOSX``) skipped."""
    return sorted(p for p in folder.iterdir() if p.is_dir() and not is_hidden([p.name]))


def _class_images(folder: Path) -> list[str]:
    """The images of a class folder, sorted by name; a folder without any is a DatasetError."""
    images = list_images(folder)
    if not images:
        raise DatasetError(f"{folder}: class folder has no images ({', '.join(IMAGE_EXTENSIONS)})")
    return [str(p) for p in images]


def _ignored(base: Path, folders: list[Path]) -> list[str]:
    """What an image folder does not read, relative to ``base``: files beside the class
    folders (but ``roles.csv``), and sub-folders (``name/``) and non-image files inside them;
    hidden entries are not listed."""
    out = [
        p.name
        for p in sorted(base.iterdir())
        if p.is_file() and p.name != ROLES_FILE and not is_hidden([p.name])
    ]
    for folder in folders:
        for p in sorted(folder.iterdir()):
            if is_hidden([p.name]) or (p.is_file() and p.suffix.lower() in IMAGE_EXTENSIONS):
                continue
            out.append(p.relative_to(base).as_posix() + ("/" if p.is_dir() else ""))
    return out


def _from_class_folders(name: str, folders: list[Path]) -> ImageDataset:
    """One class per folder, in the given order; images sorted by name within each folder."""
    sources, labels = [], []
    for c, folder in enumerate(folders):
        images = _class_images(folder)
        sources += images
        labels += [c] * len(images)
    check_image_files(sources)
    return ImageDataset(name, sources, labels, [f.name for f in folders])


@register("image_folder")
def image_folder(root: str | Path | None = None) -> ImageDataset:
    """``root/<class>/<image>``; classes sorted by folder name.

    Query/gallery roles (see :data:`ROLES_FILE` and :func:`_role_trees`): ``root/query/<class>/``
    and ``root/gallery/<class>/`` trees beside or instead of the plain (training) classes, or a
    ``roles.csv`` list file giving some class folders' images the role ``query`` or ``gallery``.
    """
    base = _root(root, "image_folder")
    folders = _class_folders(base)
    trees = _role_trees(folders)
    listed = base / ROLES_FILE
    if trees and listed.exists():
        raise DatasetError(
            f"{listed}: give roles by query/ and gallery/ folders or by {ROLES_FILE}, not both"
        )
    if trees:
        plain = [f for f in folders if f not in trees.values()]
        ds = _with_role_trees(plain, trees)
        inner = [c for t in trees.values() for c in _class_folders(t)]
        ds.ignored = _ignored(base, plain + inner)
        return ds
    if not folders:
        raise DatasetError(f"{base}: no class folders (expected root/<class>/<image>)")
    ds = _from_class_folders("image_folder", folders)
    if listed.exists():
        ds = _with_roles_file(ds, base, require_file(listed, ROLES_FILE))
    ds.ignored = _ignored(base, folders)
    return ds


# An image folder's list of roles: CSV with the header ``path,role``; ``path`` relative to the
# root (``<class>/<image>``), ``role`` ``query`` or ``gallery``; images not listed train.
ROLES_FILE = "roles.csv"
TEST_ROLES = ("query", "gallery")


def _role_trees(folders: list[Path]) -> dict[str, Path]:
    """The ``query`` and ``gallery`` folders among ``folders`` that hold class folders (and no
    images directly: a class *named* ``query`` stays a class); both or neither."""
    trees = {
        f.name: f
        for f in folders
        if f.name in TEST_ROLES and _class_folders(f) and not list_images(f)
    }
    if len(trees) == 1:
        (role, tree), other = next(iter(trees.items())), set(TEST_ROLES) - set(trees)
        raise DatasetError(
            f"{tree}: a {role}/ tree of class folders needs a {other.pop()}/ tree beside it"
        )
    return trees


def _with_role_trees(plain: list[Path], trees: dict[str, Path]) -> ImageDataset:
    """Plain class folders (role ``train``) and the ``query/``, ``gallery/`` trees' class folders;
    a class is a folder name (``query/a`` and ``gallery/a`` are one class), sorted by name; within
    a class its training, then query, then gallery images, each sorted by name."""
    by_class: dict[str, list[tuple[Path, str]]] = {}
    for folder in plain:
        by_class.setdefault(folder.name, []).append((folder, "train"))
    for role in TEST_ROLES:
        for folder in _class_folders(trees[role]):
            by_class.setdefault(folder.name, []).append((folder, role))
    sources, labels, roles = [], [], []
    names = sorted(by_class)
    for c, name in enumerate(names):
        for folder, role in by_class[name]:
            images = _class_images(folder)
            sources += images
            labels += [c] * len(images)
            roles += [role] * len(images)
    check_image_files(sources)
    where = str(trees["gallery"])
    return ImageDataset("image_folder", sources, labels, names, roles=roles, roles_source=where)


def _with_roles_file(ds: ImageDataset, base: Path, listed: Path) -> ImageDataset:
    """``ds`` (an image folder) with the roles ``listed`` gives (see :data:`ROLES_FILE`)."""
    index = {Path(s).relative_to(base).as_posix(): i for i, s in enumerate(ds.sources)}
    roles = np.full(len(ds), "train", dtype=object)
    seen: dict[str, int] = {}
    for lineno, (path, role) in _roles_rows(listed):
        key = PurePosixPath(path).as_posix()
        if key in seen:
            raise DatasetError(
                f"{listed}:{lineno}: image {path!r} is listed twice (also at line {seen[key]})"
            )
        if key not in index:
            raise DatasetError(
                f"{listed}:{lineno}: {path!r} is not an image of a class folder of {base}"
            )
        if role not in TEST_ROLES:
            raise DatasetError(f"{listed}:{lineno}: role {role!r} is not query or gallery")
        seen[key] = lineno
        roles[index[key]] = role
    return ImageDataset(
        ds.name, ds.sources, ds.labels, ds.class_names, roles=roles, roles_source=str(listed)
    )


def _roles_rows(listed: Path) -> list[tuple[int, tuple[str, str]]]:
    """The rows ``(line number, (path, role))`` of a roles file, after its ``path,role`` header."""
    try:
        lines = listed.read_text(encoding="utf-8").splitlines()
    except UnicodeDecodeError as e:
        raise DatasetError(
            f"{listed}: not a UTF-8 text file ({e.reason} at byte {e.start})"
        ) from None
    except OSError as e:
        raise DatasetError(f"{listed}: cannot read the roles file ({e.strerror})") from None
    rows = [(n, r) for n, r in enumerate(csv.reader(lines), 1) if any(x.strip() for x in r)]
    if not rows or [x.strip() for x in rows[0][1]] != ["path", "role"]:
        raise DatasetError(f"{listed}: expected the header line 'path,role'")
    out = []
    for lineno, row in rows[1:]:
        if len(row) != 2:
            raise DatasetError(f"{listed}:{lineno}: expected 'path,role'")
        out.append((lineno, (row[0].strip(), row[1].strip())))
    return out


@register("cub200")
def cub200(root: str | Path | None = None) -> ImageDataset:
    """CUB-200-2011: ``CUB_200_2011/images/<NNN.name>/*.jpg``; class order = folder order.

    ``root`` may be the folder that contains ``CUB_200_2011`` or ``CUB_200_2011`` itself.
    """
    base = _root(root, "cub200")
    images = base / "CUB_200_2011" / "images"
    if not images.is_dir():
        images = base / "images"
    require_dir(images, "CUB_200_2011/images folder")
    folders = _class_folders(images)
    if not folders:
        raise DatasetError(f"{images}: no class folders")
    return _from_class_folders("cub200", folders)


@register("cars196")
def cars196(root: str | Path | None = None) -> ImageDataset:
    """Cars196: ``cars_annos.mat`` + ``car_ims/``; all 16,185 images, labels 1..196 → 0..195."""
    from scipy.io import loadmat

    base = _root(root, "cars196")
    annos = require_file(base / "cars_annos.mat", "cars196 annotation file cars_annos.mat")
    try:
        mat = loadmat(str(annos))
        records = mat["annotations"][0]
        rel_paths = [str(a["relative_im_path"][0]) for a in records]
        classes = [int(np.asarray(a["class"]).reshape(-1)[0]) for a in records]
    except Exception as e:  # scipy raises several unrelated types on a bad .mat
        raise DatasetError(
            f"{annos}: not a valid cars_annos.mat ({type(e).__name__}: {e})"
        ) from None
    sources = [_inside(base, p, annos) for p in rel_paths]
    check_image_files(sources)
    labels, ids = renumber(classes)
    names = [str(i) for i in ids]
    if "class_names" in mat:
        all_names = [str(np.asarray(n).reshape(-1)[0]) for n in mat["class_names"].reshape(-1)]
        names = [all_names[i - 1] if 0 < i <= len(all_names) else str(i) for i in ids]
    return ImageDataset("cars196", sources, labels, names)


def _read_rows(path: Path) -> list[list[str]]:
    """The non-blank lines of a text annotation file, split on whitespace."""
    try:
        text = path.read_text(encoding="utf-8")
    except UnicodeDecodeError as e:
        raise DatasetError(
            f"{path}: not a UTF-8 text file ({e.reason} at byte {e.start})"
        ) from None
    except OSError as e:
        raise DatasetError(f"{path}: cannot read the annotation file ({e.strerror})") from None
    return [ln.split() for ln in text.splitlines() if ln.strip()]


def _read_table(path: Path, header: str) -> list[list[str]]:
    body = _read_rows(path)
    if not body or body[0] != header.split():
        raise DatasetError(f"{path}: expected the header line {header!r}")
    return body[1:]


@register("sop")
def sop(root: str | Path | None = None) -> ImageDataset:
    """Stanford Online Products: ``Ebay_train.txt`` then ``Ebay_test.txt``; label = class_id − 1.

    ``super_labels``: the 12 product categories, ``super_class_id − 1`` (ids renumbered in
    sorted order, as the classes); a class listed with two super-classes is refused.
    """
    base = _root(root, "sop")
    sources, classes, supers = [], [], []
    first: dict[int, tuple[int, str]] = {}  # class_id → (super_class_id, where first listed)
    for split in ("Ebay_train.txt", "Ebay_test.txt"):
        table = require_file(base / split, f"SOP annotation file {split}")
        for lineno, row in enumerate(
            _read_table(table, "image_id class_id super_class_id path"), 2
        ):
            if len(row) != 4 or not all(x.isascii() and x.isdigit() for x in row[1:3]):
                raise DatasetError(
                    f"{table}:{lineno}: expected 'image_id class_id super_class_id path'"
                )
            class_id, super_id = int(row[1]), int(row[2])
            known = first.setdefault(class_id, (super_id, f"{table.name}:{lineno}"))
            if known[0] != super_id:
                raise DatasetError(
                    f"{table}:{lineno}: class {class_id} has super_class_id {super_id} here "
                    f"but {known[0]} at {known[1]}"
                )
            sources.append(_inside(base, row[3], table))
            classes.append(class_id)
            supers.append(super_id)
    check_image_files(sources)
    labels, ids = renumber(classes)  # the official ids are 1..22634, so this is class_id − 1
    return ImageDataset(
        "sop", sources, labels, [str(i) for i in ids], super_labels=renumber(supers)[0]
    )


@register("inshop")
def inshop(root: str | Path | None = None) -> ImageDataset:
    """In-Shop Clothes Retrieval: ``list_eval_partition.txt`` + ``img/``; one class per item id.

    Classes are ordered by item id. ``dataset.roles[i]`` keeps the official ``train`` /
    ``query`` / ``gallery`` status of each image (``evaluation_status``); an image listed twice
    or another status is refused.
    """
    base = _root(root, "inshop")
    table = require_file(
        base / "list_eval_partition.txt", "In-Shop annotation file list_eval_partition.txt"
    )
    lines = _read_rows(table)
    if len(lines) < 2 or lines[1] != ["image_name", "item_id", "evaluation_status"]:
        raise DatasetError(
            f"{table}: expected a count line, then 'image_name item_id evaluation_status'"
        )
    rows = lines[2:]
    seen: dict[str, int] = {}
    for lineno, row in enumerate(rows, 3):
        if len(row) != 3:
            raise DatasetError(f"{table}:{lineno}: expected 'image_name item_id evaluation_status'")
        if row[2] not in ROLES:
            raise DatasetError(
                f"{table}:{lineno}: evaluation_status {row[2]!r} is not one of {', '.join(ROLES)}"
            )
        if seen.setdefault(row[0], lineno) != lineno:
            raise DatasetError(
                f"{table}:{lineno}: image {row[0]!r} is listed twice (also at line {seen[row[0]]})"
            )
    sources = [_inside(base, r[0], table) for r in rows]
    check_image_files(sources)
    labels, ids = renumber([r[1] for r in rows])
    roles = [r[2] for r in rows]
    return ImageDataset(
        "inshop", sources, labels, [str(i) for i in ids], roles=roles, roles_source=str(table)
    )


@register("omniglot")
def omniglot(root: str | Path | None = None) -> ImageDataset:
    """Omniglot from its zip or the extracted folder; class = ``alphabet/character``.

    ``root`` may be the ``.zip`` file, the folder it extracts to, or a folder that holds the zip.
    Without a root the "background small 1" zip is downloaded once, checked against its SHA-256
    and cached (see ``mlrc.data.download``).
    """
    path = Path(root).expanduser() if root is not None else fetch_omniglot()
    if path.is_dir():
        zips = sorted(path.glob("*.zip"))
        if zips and not any(p.is_dir() for p in path.iterdir()):
            path = zips[0]
    if path.is_file():
        return _omniglot_zip(path)
    base = require_dir(path, "omniglot root")
    # character folders = folders that hold images directly; class name = "alphabet/character"
    folders = sorted(
        {
            p.parent
            for p in base.rglob("*")
            if p.suffix.lower() in IMAGE_EXTENSIONS
            and not is_hidden(p.relative_to(base).parts)
            and p.is_file()
        },
        key=lambda c: (c.parent.name, c.name),
    )
    if not folders:
        raise DatasetError(f"{base}: no <alphabet>/<character>/<image> folders")
    ds = _from_class_folders("omniglot", folders)
    ds.class_names = [f"{f.parent.name}/{f.name}" for f in folders]
    return ds


def _omniglot_zip(path: Path) -> ImageDataset:
    try:
        zf = zipfile.ZipFile(path)
    except (zipfile.BadZipFile, OSError) as e:
        raise DatasetError(f"{path}: not a readable zip file ({e})") from None
    with zf:
        members = [
            m
            for m in zf.infolist()
            if not m.is_dir()
            and PurePosixPath(m.filename).suffix.lower() in IMAGE_EXTENSIONS
            and not is_hidden(PurePosixPath(m.filename).parts)
        ]
        by_class: dict[str, list[zipfile.ZipInfo]] = {}
        for m in members:
            parts = PurePosixPath(m.filename).parts
            if len(parts) < 3:
                continue
            by_class.setdefault(f"{parts[-3]}/{parts[-2]}", []).append(m)
        if not by_class:
            raise DatasetError(f"{path}: no <alphabet>/<character>/<image> entries in the zip")
        names = sorted(by_class)
        sources, labels, origins = [], [], []
        for c, name in enumerate(names):
            for m in sorted(by_class[name], key=lambda m: m.filename):
                try:
                    sources.append(zf.read(m))
                except (zipfile.BadZipFile, OSError) as e:
                    bad_file(f"{path}:{m.filename}", f"cannot read from zip ({e})")
                    sources.append(b"")  # listed, it fails to decode
                if m.file_size == 0:
                    bad_file(f"{path}:{m.filename}", "image file is empty (0 bytes)")
                labels.append(c)
                origins.append(f"{path}:{m.filename}")
    return ImageDataset("omniglot", sources, labels, names, origins=origins)
