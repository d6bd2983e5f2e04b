"""Bad query/gallery datasets and super-classes, built file by file, and the one line a user
sees: a query class with no gallery image, a role that is not query or gallery, an image listed
twice, a query/ tree without its gallery/, a class with training and query/gallery images (a
class-disjoint split cannot place it), a split file whose test classes are not the query/gallery
classes, an SOP class with two super-classes."""

from __future__ import annotations

import re
import zlib
from pathlib import Path

import numpy as np
import pytest
import yaml
from PIL import Image

from mlrc import data
from mlrc.config import ConfigError
from mlrc.config.splits import build_split, resolve_split
from mlrc.data.base import DatasetError, ImageDataset


def exactly(message: str) -> str:
    return f"^{re.escape(message)}$"


def tree(root: Path, files: list[str]) -> Path:
    """A distinct small JPEG (noise seeded by its path) at each of ``files`` under ``root``."""
    for f in files:
        (root / f).parent.mkdir(parents=True, exist_ok=True)
        rng = np.random.default_rng(zlib.crc32(f.encode()))
        Image.fromarray(rng.integers(0, 256, (8, 8, 3), dtype=np.uint8)).save(root / f)
    return root


def one_line(e: pytest.ExceptionInfo) -> str:
    message = str(e.value)
    assert "\n" not in message
    return message


# --- image folders -----------------------------------------------------------------------------


def test_query_class_absent_from_the_gallery(tmp_path):
    root = tree(tmp_path, ["a/0.jpg", "query/b/0.jpg", "query/c/0.jpg", "gallery/c/0.jpg"])
    with pytest.raises(DatasetError) as e:
        data.build("image_folder", root=root)
    assert one_line(e) == f"query class 'b' has no gallery image in {root / 'gallery'}"


def test_query_class_absent_from_the_gallery_on_the_command_line(tmp_path):
    from typer.testing import CliRunner

    from mlrc.cli import app

    root = tree(tmp_path, ["a/0.jpg", "query/b/0.jpg", "query/d/0.jpg", "gallery/c/0.jpg"])
    r = CliRunner().invoke(app, ["data", "summary", "image_folder", "--root", str(root)])
    assert r.exit_code == 2
    assert r.output.strip().splitlines() == [
        f"error: query class 'b' has no gallery image in {root / 'gallery'} "
        "(and 1 more query classes)"
    ]


def test_query_tree_without_a_gallery_tree(tmp_path):
    root = tree(tmp_path, ["a/0.jpg", "query/b/0.jpg"])
    with pytest.raises(
        DatasetError,
        match=exactly(
            f"{root / 'query'}: a query/ tree of class folders needs a gallery/ tree beside it"
        ),
    ):
        data.build("image_folder", root=root)


def test_roles_file_and_trees_together(tmp_path):
    root = tree(tmp_path, ["a/0.jpg", "query/b/0.jpg", "gallery/b/0.jpg"])
    (root / "roles.csv").write_text("path,role\n")
    with pytest.raises(
        DatasetError,
        match=exactly(
            f"{root / 'roles.csv'}: give roles by query/ and gallery/ folders or by roles.csv, not both"
        ),
    ):
        data.build("image_folder", root=root)


FILES = ["a/0.jpg", "a/1.jpg", "b/0.jpg", "b/1.jpg"]


@pytest.mark.parametrize(
    ("rows", "problem"),
    [
        (["b/0.jpg,query", "b/1.jpg,train"], "3: role 'train' is not query or gallery"),
        (["b/0.jpg,query", "b/1.jpg,Gallery"], "3: role 'Gallery' is not query or gallery"),
        (
            ["b/0.jpg,query", "b/1.jpg,gallery", "b/0.jpg,gallery"],
            "4: image 'b/0.jpg' is listed twice (also at line 2)",
        ),
        (
            ["b/0.jpg,query", "b/9.jpg,gallery"],
            "3: 'b/9.jpg' is not an image of a class folder of ROOT",
        ),
        (["b/0.jpg,query,extra"], "2: expected 'path,role'"),
        (["b/0.jpg,query"], None),  # class b: a query, no gallery
    ],
)
def test_bad_roles_file(tmp_path, rows, problem):
    root = tree(tmp_path / "root", FILES)
    listed = root / "roles.csv"
    listed.write_text("path,role\n" + "\n".join(rows) + "\n")
    with pytest.raises(DatasetError) as e:
        data.build("image_folder", root=root)
    if problem is None:
        assert one_line(e) == f"query class 'b' has no gallery image in {listed}"
    else:
        assert one_line(e) == f"{listed}:{problem.replace('ROOT', str(root))}"


def test_roles_file_without_its_header(tmp_path):
    root = tree(tmp_path, FILES)
    (root / "roles.csv").write_text("b/0.jpg,query\nb/1.jpg,gallery\n")
    with pytest.raises(
        DatasetError, match=exactly(f"{root / 'roles.csv'}: expected the header line 'path,role'")
    ):
        data.build("image_folder", root=root)


# --- classes a class-disjoint split cannot place ---------------------------------------------------


def test_class_with_training_and_query_images(tmp_path):
    files = [*FILES, "c/0.jpg", "d/0.jpg", "e/0.jpg", "e/1.jpg", "f/0.jpg", "f/1.jpg"]
    root = tree(tmp_path, [*files, "query/a/2.jpg", "gallery/a/3.jpg", "gallery/z/0.jpg"])
    ds = data.build("image_folder", root=root)  # loads: the split is what cannot place class a
    with pytest.raises(ConfigError) as e:
        build_split(None, ds, 2, "kfold", "study.yaml: split")
    assert one_line(e) == (
        f"study.yaml: dataset: image_folder: class 'a' has training images "
        f"({root / 'a' / '0.jpg'}) and query images ({root / 'query' / 'a' / '2.jpg'}): a test "
        f"class cannot train (query/gallery roles from {root / 'gallery'})"
    )


def test_inshop_item_with_train_and_query_images(tmp_path):
    rows = [
        ("img/1.jpg", "id_1", "train"),
        ("img/2.jpg", "id_1", "query"),
        ("img/3.jpg", "id_1", "gallery"),
        ("img/4.jpg", "id_2", "train"),
    ]
    ds = inshop(tmp_path, rows)
    spec = resolve_split("predefined", "inshop", 2, "kfold")
    with pytest.raises(ConfigError) as e:
        build_split(spec, ds, 2, "kfold", "s.yaml: split")
    assert one_line(e).startswith(
        "s.yaml: split: predefined: inshop: class 'id_1' has training images"
    )


@pytest.mark.parametrize(
    ("test", "problem"),
    [
        (["c", "d", "e"], "class 'e' has no query or gallery image in image_folder"),
        (["c", "d"], "class 'g' has query or gallery images in image_folder but is not listed"),
    ],
)
def test_split_file_whose_test_classes_are_not_the_query_gallery_classes(tmp_path, test, problem):
    root = tree(tmp_path / "root", [f"{c}/{k}.jpg" for c in "abef" for k in (0, 1)])
    tree(root, ["query/c/0.jpg", "gallery/c/1.jpg", "query/d/0.jpg", "gallery/d/1.jpg"])
    tree(root, ["gallery/g/0.jpg"])
    ds = data.build("image_folder", root=root)
    split = tmp_path / "split.yaml"
    split.write_text(yaml.safe_dump({"test": test}))
    spec = resolve_split(split.name, ds.name, 2, "kfold", "s.yaml: split", tmp_path)
    with pytest.raises(ConfigError) as e:
        build_split(spec, ds, 2, "kfold", "s.yaml: split")
    assert one_line(e) == (
        f"s.yaml: split: split.yaml: test: {problem}: its test classes are those of its query "
        "and gallery images"
    )


# --- In-Shop and SOP lists -----------------------------------------------------------------------


def inshop(root: Path, rows: list[tuple[str, str, str]]) -> ImageDataset:
    lines = [str(len(rows)), "image_name item_id evaluation_status", *(" ".join(r) for r in rows)]
    tree(root, [r[0] for r in rows])
    (root / "list_eval_partition.txt").write_text("\n".join(lines) + "\n")
    return data.build("inshop", root=root)


def test_inshop_image_listed_twice(tmp_path):
    rows = [
        ("img/1.jpg", "id_1", "query"),
        ("img/2.jpg", "id_1", "gallery"),
        ("img/1.jpg", "id_1", "gallery"),
    ]
    with pytest.raises(DatasetError) as e:
        inshop(tmp_path, rows)
    table = tmp_path / "list_eval_partition.txt"
    assert one_line(e) == f"{table}:5: image 'img/1.jpg' is listed twice (also at line 3)"


def test_inshop_unknown_status(tmp_path):
    rows = [("img/1.jpg", "id_1", "query"), ("img/2.jpg", "id_1", "val")]
    with pytest.raises(DatasetError) as e:
        inshop(tmp_path, rows)
    table = tmp_path / "list_eval_partition.txt"
    assert one_line(e) == (
        f"{table}:4: evaluation_status 'val' is not one of train, query, gallery"
    )


def test_inshop_query_item_without_gallery_images(tmp_path):
    rows = [
        ("img/1.jpg", "id_1", "query"),
        ("img/2.jpg", "id_1", "query"),
        ("img/3.jpg", "id_2", "gallery"),
    ]
    with pytest.raises(DatasetError) as e:
        inshop(tmp_path, rows)
    table = tmp_path / "list_eval_partition.txt"
    assert one_line(e) == f"query class 'id_1' has no gallery image in {table}"


def test_sop_class_with_two_super_classes(tmp_path):
    rows = ["1 1 3 a/1.jpg", "2 1 3 a/2.jpg", "3 1 4 a/3.jpg"]
    (tmp_path / "Ebay_train.txt").write_text(
        "image_id class_id super_class_id path\n" + "\n".join(rows)
    )
    (tmp_path / "Ebay_test.txt").write_text("image_id class_id super_class_id path\n")
    tree(tmp_path, ["a/1.jpg", "a/2.jpg", "a/3.jpg"])
    with pytest.raises(DatasetError) as e:
        data.build("sop", root=tmp_path)
    table = tmp_path / "Ebay_train.txt"
    assert one_line(e) == (
        f"{table}:4: class 1 has super_class_id 4 here but 3 at Ebay_train.txt:2"
    )


def test_sop_super_class_that_is_not_a_number(tmp_path):
    (tmp_path / "Ebay_train.txt").write_text(
        "image_id class_id super_class_id path\n1 1 x a/1.jpg\n"
    )
    (tmp_path / "Ebay_test.txt").write_text("image_id class_id super_class_id path\n")
    tree(tmp_path, ["a/1.jpg"])
    with pytest.raises(
        DatasetError,
        match=exactly(
            f"{tmp_path / 'Ebay_train.txt'}:2: expected 'image_id class_id super_class_id path'"
        ),
    ):
        data.build("sop", root=tmp_path)


def test_roles_and_super_labels_given_in_python_are_checked():
    with pytest.raises(
        DatasetError, match=exactly("p: role 'probe' is not one of train, query, gallery (x)")
    ):
        ImageDataset(
            "x", [b"1", b"2"], [0, 0], ["a"], origins=["p", "q"], roles=["probe", "gallery"]
        )
    with pytest.raises(DatasetError, match=exactly("x: 1 roles for 2 images")):
        ImageDataset("x", [b"1", b"2"], [0, 0], ["a"], roles=["query"])
    with pytest.raises(DatasetError, match=exactly("x: super-class labels must be integers ≥ 0")):
        ImageDataset("x", [b"1", b"2"], [0, 0], ["a"], super_labels=[0.5, 1.0])
