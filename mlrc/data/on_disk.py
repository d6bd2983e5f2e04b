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

import zipfile
from pathlib import Path, PurePosixPath

import numpy as np

from mlrc.data.base import (
    IMAGE_EXTENSIONS,
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


def _from_class_folders(name: str, folders: list[Path]) -> ImageDataset:
    """One class per folder, in the given order; images sorted by name within each folder."""
    sources, labels = [], []
    for c, folder in enumerate(folders):
        images = list_images(folder)
        if not images:
            raise DatasetError(
                f"{folder}: class folder has no images ({', '.join(IMAGE_EXTENSIONS)})"
            )
        sources += [str(p) for p in images]
        labels += [c] * len(images)
    check_image_files(sources)
    return ImageDataset(name, sources, labels, [f.name for f in folders])


@register("image_folder")
def image_folder(root: str | Path | None = None) -> ImageDataset:
    """``root/<class>/<image>``; classes sorted by folder name."""
    base = _root(root, "image_folder")
    folders = _class_folders(base)
    if not folders:
        raise DatasetError(f"{base}: no class folders (expected root/<class>/<image>)")
    return _from_class_folders("image_folder", folders)


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
    """Stanford Online Products: ``Ebay_train.txt`` then ``Ebay_test.txt``; label = class_id − 1."""
    base = _root(root, "sop")
    sources, classes = [], []
    for split in ("Ebay_train.txt", "Ebay_test.txt"):
        table = require_file(base / split, f"SOP annotation file {split}")
        for lineno, row in enumerate(
            _read_table(table, "image_id class_id super_class_id path"), 2
        ):
            if len(row) != 4 or not (row[1].isascii() and row[1].isdigit()):
                raise DatasetError(
                    f"{table}:{lineno}: expected 'image_id class_id super_class_id path'"
                )
            sources.append(_inside(base, row[3], table))
            classes.append(int(row[1]))
    check_image_files(sources)
    labels, ids = renumber(classes)  # the official ids are 1..22634, so this is class_id − 1
    return ImageDataset("sop", sources, labels, [str(i) for i in ids])


@register("inshop")
def inshop(root: str | Path | None = None) -> ImageDataset:
    """In-Shop Clothes Retrieval: ``list_eval_partition.txt`` + ``img/``; one class per item id.

    Classes are ordered by item id. ``dataset.partition[i]`` keeps the official
    ``train`` / ``query`` / ``gallery`` status of each image.
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
    for lineno, row in enumerate(rows, 3):
        if len(row) != 3:
            raise DatasetError(f"{table}:{lineno}: expected 'image_name item_id evaluation_status'")
    sources = [_inside(base, r[0], table) for r in rows]
    check_image_files(sources)
    labels, ids = renumber([r[1] for r in rows])
    ds = ImageDataset("inshop", sources, labels, [str(i) for i in ids])
    ds.partition = [r[2] for r in rows]
    return ds


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
