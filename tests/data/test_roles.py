"""Datasets with query/gallery roles and super-classes, built file by file in tmp_path: an
In-Shop layout, an image folder with ``query/`` and ``gallery/`` trees or a ``roles.csv``, SOP's
``super_class_id``; the splits they get (the query/gallery classes test) and the roles of the
test view's rows (``mlrc.search.baseline.test_roles``), through the decoded cache too.

Expected roles, classes and super-classes are re-derived here from the files as written (the
path of each image, the rows of each list), never from the loaders' output."""

from __future__ import annotations

import pickle
import zlib
from pathlib import Path
from types import SimpleNamespace

import numpy as np
import pytest
import yaml
from PIL import Image

from mlrc import data
from mlrc.config.splits import build_split, resolve_split
from mlrc.data.cache import decoded_cache, eval_crops
from mlrc.search import baseline
from mlrc.train import View


def png(path: Path) -> Path:
    """A distinct 12 × 10 noise PNG (seeded by its path)."""
    path.parent.mkdir(parents=True, exist_ok=True)
    rng = np.random.default_rng(zlib.crc32(str(path).encode()))
    Image.fromarray(rng.integers(0, 256, (10, 12, 3), dtype=np.uint8)).save(path)
    return path


def tree(root: Path, files: list[str]) -> Path:
    for f in files:
        png(root / f)
    return root


# --- In-Shop -----------------------------------------------------------------------------------

# (image_name, item_id, evaluation_status), as list_eval_partition.txt lists them: 6 train
# items, 3 test items (id_00000003 and id_00000007 have queries; id_00000008 is gallery only)
INSHOP_ROWS = [
    (f"img/{item}/{k:02d}_{status}.jpg", item, status)
    for item, statuses in [
        ("id_00000001", ["train", "train"]),
        ("id_00000002", ["train", "train", "train"]),
        ("id_00000003", ["query", "gallery", "gallery"]),
        ("id_00000004", ["train", "train"]),
        ("id_00000005", ["train", "train"]),
        ("id_00000006", ["train", "train"]),
        ("id_00000007", ["gallery", "query", "query", "gallery"]),
        ("id_00000008", ["gallery", "gallery"]),
        ("id_00000009", ["train", "train"]),
    ]
    for k, status in enumerate(statuses)
]


def inshop_tree(root: Path, rows: list[tuple[str, str, str]] = INSHOP_ROWS) -> Path:
    lines = [str(len(rows)), "image_name item_id evaluation_status"]
    lines += [" ".join(r) for r in rows]
    tree(root, [r[0] for r in rows])
    (root / "list_eval_partition.txt").write_text("\n".join(lines) + "\n")
    return root


def test_inshop_keeps_its_official_roles(tmp_path):
    ds = data.build("inshop", root=inshop_tree(tmp_path))
    assert ds.roles.tolist() == [status for _, _, status in INSHOP_ROWS]
    assert ds.partition == ds.roles.tolist()  # the older name
    assert ds.super_labels is None


@pytest.mark.parametrize("split", [None, "predefined"])
def test_inshop_tests_its_query_and_gallery_items_and_validates_on_train_items(tmp_path, split):
    ds = data.build("inshop", root=inshop_tree(tmp_path))
    spec = resolve_split(split, "inshop", 2, "kfold")
    parts = build_split(spec, ds, 2, "kfold")
    test_items = sorted({item for _, item, status in INSHOP_ROWS if status != "train"})
    train_items = sorted({item for _, item, status in INSHOP_ROWS if status == "train"})
    assert [ds.class_names[c] for c in parts.test_classes] == test_items
    assert [ds.class_names[c] for c in parts.trainval_classes] == train_items
    for fold in parts.folds:  # validation: all against all among the training items
        validated = {ds.class_names[c] for c in fold.val_classes}
        assert validated <= set(train_items) and len(validated) >= 2


def test_the_test_view_rows_carry_the_roles_with_and_without_the_decoded_cache(tmp_path):
    ds = data.build("inshop", root=inshop_tree(tmp_path / "inshop"))
    ctx = SimpleNamespace(dataset=ds)  # test_roles reads the session's dataset only
    parts = build_split(None, ds, 2, "kfold")
    expected = [status for _, _, status in INSHOP_ROWS if status != "train"]  # file order
    view = View(ds, parts.test_classes, lambda im: im)
    assert baseline.test_roles(ctx, view).tolist() == expected
    cached = decoded_cache(ds, 8, tmp_path / "cache", progress=False)
    crops = eval_crops(cached, 8, 8, tmp_path / "cache", progress=False)
    for copy in (cached, crops, crops.as_arrays(), pickle.loads(pickle.dumps(crops))):
        assert copy.roles.tolist() == ds.roles.tolist()
        view = View(copy, parts.test_classes, lambda im: im)
        assert baseline.test_roles(ctx, view).tolist() == expected


def test_a_dataset_without_roles_is_all_against_all(tmp_path):
    files = [f"{c}/{k}.png" for c in "abcd" for k in (0, 1)]
    ds = data.build("image_folder", root=tree(tmp_path, files))
    assert ds.roles is None
    view = View(ds, [2, 3], lambda im: im)
    assert baseline.test_roles(SimpleNamespace(dataset=ds), view).tolist() == ["all"] * 4
    assert baseline.test_super_labels(SimpleNamespace(dataset=ds), view) is None


# --- image folders: query/ and gallery/ trees, or roles.csv ------------------------------------

FOLDER_FILES = [
    *(f"{c}/{k}.png" for c in ("apple", "kiwi", "lime", "pear") for k in range(2)),  # training
    "query/fig/q0.png",
    "query/fig/q1.png",
    "gallery/fig/g0.png",
    "query/date/q0.png",
    "gallery/date/g0.png",
    "gallery/date/g1.png",
    "gallery/plum/g0.png",  # a gallery-only class (distractors)
]


def expected_items(root: Path, files: list[str]) -> list[tuple[str, str, str]]:
    """(class, role, path) of every image, in the loader's documented order: classes by name,
    then training, query, gallery images, each by file name."""
    items = []
    for f in files:
        parts = f.split("/")
        role, name = (parts[0], parts[1]) if len(parts) == 3 else ("train", parts[0])
        items.append((name, role, str(root / f)))
    order = {"train": 0, "query": 1, "gallery": 2}
    return sorted(items, key=lambda t: (t[0], order[t[1]], Path(t[2]).name))


def test_image_folder_with_query_and_gallery_trees(tmp_path):
    root = tree(tmp_path / "root", FOLDER_FILES)
    ds = data.build("image_folder", root=root)
    items = expected_items(root, FOLDER_FILES)
    names = sorted({name for name, _, _ in items})
    assert ds.class_names == names
    assert ds.sources == [p for _, _, p in items]
    assert ds.roles.tolist() == [role for _, role, _ in items]
    assert [ds.class_names[c] for c in ds.labels] == [name for name, _, _ in items]
    parts = build_split(None, ds, 2, "kfold")
    assert [names[c] for c in parts.test_classes] == ["date", "fig", "plum"]
    assert [names[c] for c in parts.trainval_classes] == ["apple", "kiwi", "lime", "pear"]
    view = View(ds, parts.test_classes, lambda im: im)
    rows = [role for _, role, _ in items if role != "train"]
    assert baseline.test_roles(SimpleNamespace(dataset=ds), view).tolist() == rows


def test_image_folder_with_only_query_and_gallery_trees_loads(tmp_path):
    files = [f for f in FOLDER_FILES if f.count("/") == 2]
    ds = data.build("image_folder", root=tree(tmp_path, files))
    assert set(ds.roles.tolist()) == {"query", "gallery"} and ds.class_names == [
        "date",
        "fig",
        "plum",
    ]


def test_a_class_named_query_holding_images_stays_a_class(tmp_path):
    files = ["query/0.png", "query/1.png", "b/0.png", "b/1.png", "gallery/0.png"]
    ds = data.build("image_folder", root=tree(tmp_path, files))
    assert ds.roles is None and ds.class_names == ["b", "gallery", "query"]


def test_image_folder_with_a_roles_file(tmp_path):
    files = [f"{c}/{k}.png" for c in ("a", "b", "c", "d", "e", "f") for k in range(3)]
    root = tree(tmp_path, files)
    listed = {"e/0.png": "query", "e/1.png": "gallery", "e/2.png": "gallery"}
    listed |= {"f/2.png": "query", "f/0.png": "gallery", "f/1.png": "query"}
    text = "path,role\n" + "".join(f"{p},{r}\n" for p, r in listed.items())
    (root / "roles.csv").write_text(text)
    ds = data.build("image_folder", root=root)
    assert ds.roles.tolist() == [listed.get(f, "train") for f in files]  # files is load order
    parts = build_split(None, ds, 2, "kfold")
    assert [ds.class_names[c] for c in parts.test_classes] == ["e", "f"]


# --- SOP's super-classes -----------------------------------------------------------------------


def test_sop_reads_its_super_classes(tmp_path):
    # (class_id, super_class_id, path): super-class ids as in the official files (1..12)
    train = [
        (1, 5, "bicycle_final/1_0.JPG"),
        (1, 5, "bicycle_final/1_1.JPG"),
        (2, 12, "toaster_final/2_0.JPG"),
    ]
    test = [
        (3, 1, "cabinet_final/3_0.JPG"),
        (3, 1, "cabinet_final/3_1.JPG"),
        (4, 12, "toaster_final/4_0.JPG"),
    ]
    for name, rows in (("Ebay_train.txt", train), ("Ebay_test.txt", test)):
        lines = ["image_id class_id super_class_id path"]
        lines += [f"{i} {c} {s} {p}" for i, (c, s, p) in enumerate(rows, 1)]
        (tmp_path / name).write_text("\n".join(lines) + "\n")
        tree(tmp_path, [p for _, _, p in rows])
    ds = data.build("sop", root=tmp_path)
    ids = [s for _, s, _ in train + test]
    ranks = {s: k for k, s in enumerate(sorted(set(ids)))}  # 1 → 0, 5 → 1, 12 → 2
    assert ds.super_labels.tolist() == [ranks[s] for s in ids] == [1, 1, 2, 0, 0, 2]
    assert ds.super_labels.dtype == np.int64 and ds.roles is None
    cached = decoded_cache(ds, 8, tmp_path / "cache", progress=False)
    assert cached.super_labels.tolist() == ds.super_labels.tolist()
    view = View(cached, [2, 3], lambda im: im)
    got = baseline.test_super_labels(SimpleNamespace(dataset=ds), view)
    assert got.tolist() == [ranks[1], ranks[1], ranks[12]]  # classes 3, 3, 4 (the test half)


# --- a real study session: its split and the rows of its test view ------------------------------


@pytest.mark.parametrize("decoded_cache", [False, True])
def test_a_study_on_a_folder_with_roles_tests_its_query_and_gallery_images(tmp_path, decoded_cache):
    from mlrc.config import load_study
    from mlrc.models.small import SmallCNN
    from mlrc.search.session import build_session

    plain = [f"{c}/{k}.png" for c in "abcdefgh" for k in range(2)]
    root = tree(tmp_path / "photos", plain + [f for f in FOLDER_FILES if f.count("/") == 2])
    doc = {
        "name": "roles",
        "dataset": {"name": "image_folder", "root": str(root)},
        "preset": "cpu",
        "loss": {"name": "contrastive"},
        "search": {"trials": 1, "sampler": "tpe", "seed": 0},
        "test": {"reproductions": 2},
        "overrides": {"decoded_cache": decoded_cache},
    }
    study = tmp_path / "study.yaml"
    study.write_text(yaml.safe_dump(doc))
    url = f"sqlite:///{tmp_path / 'db.sqlite'}"
    ctx = build_session(load_study(study), url, tmp_path / "art", progress=False)
    names = ctx.dataset.class_names
    assert [names[c] for c in ctx.split.test_classes] == ["date", "fig", "plum"]
    assert all(names[c] in "abcdefgh" for f in ctx.split.folds for c in f.val_classes)
    view = baseline.view_of_test_classes(ctx, SmallCNN.input_spec)
    assert (view.ds is not ctx.dataset) == decoded_cache and view.ds.roles is not None
    items = expected_items(root, [f for f in FOLDER_FILES if f.count("/") == 2])
    assert baseline.test_roles(ctx, view).tolist() == [role for _, role, _ in items]
    assert [ctx.dataset.origins[i] for i in view.indices] == [p for _, _, p in items]
