"""Dataset loaders on tiny trees in each official layout, the real Omniglot subset, bad data."""

from __future__ import annotations

import zipfile
from pathlib import Path

import numpy as np
import pytest
import torch
from PIL import Image
from scipy.io import savemat
from torchvision import transforms

from mlrc import data
from mlrc.data import glyphs as G
from mlrc.data.base import DatasetError
from mlrc.registry import RegistryError


def img(path: Path, value: int, size=(12, 10), mode="RGB", fmt=None) -> Path:
    path.parent.mkdir(parents=True, exist_ok=True)
    color = (value, 255 - value, value // 2) if mode in ("RGB", "CMYK") else value
    if mode == "CMYK":
        color = color + (0,)
    Image.new(mode, size, color).save(path, format=fmt)
    return path


def pixel(ds, i) -> tuple[int, int, int]:
    return ds[i][0].getpixel((0, 0))


# --- official layouts ------------------------------------------------------------------------


def test_registry_lists_every_loader():
    assert data.available() == sorted(
        ["cars196", "cub200", "glyphs", "image_folder", "inshop", "omniglot", "sop"]
    )
    with pytest.raises(RegistryError, match="unknown dataset 'cub'.*did you mean 'cub200'"):
        data.build("cub")


@pytest.mark.parametrize("give", ["parent", "CUB_200_2011"])
def test_cub200_class_order_is_folder_order(tmp_path, give):
    images = tmp_path / "CUB_200_2011" / "images"
    for c, name in enumerate(
        ["001.Black_footed_Albatross", "002.Laysan_Albatross", "010.Red_winged_Blackbird"]
    ):
        for j in range(3):
            img(images / name / f"{name}_{j}.jpg", 40 * c + 10 * j)
    ds = data.build("cub200", root=tmp_path if give == "parent" else tmp_path / "CUB_200_2011")
    assert len(ds) == 9 and ds.num_classes == 3
    assert ds.class_names == [
        "001.Black_footed_Albatross",
        "002.Laysan_Albatross",
        "010.Red_winged_Blackbird",
    ]
    assert ds.labels.tolist() == [0, 0, 0, 1, 1, 1, 2, 2, 2]
    image, label = ds[4]
    assert isinstance(image, Image.Image) and image.mode == "RGB" and label == 1


def _cars_annos(root: Path, rows: list[tuple[str, int, int]], class_names: list[str]) -> None:
    fields = ["relative_im_path", "bbox_x1", "bbox_y1", "bbox_x2", "bbox_y2", "class", "test"]
    annotations = np.zeros((1, len(rows)), dtype=[(f, "O") for f in fields])
    for i, (path, cls, test) in enumerate(rows):
        annotations[0, i] = (
            np.array([path]),
            np.array([[1]]),
            np.array([[1]]),
            np.array([[9]]),
            np.array([[9]]),
            np.array([[cls]], dtype=np.uint8),
            np.array([[test]], dtype=np.uint8),
        )
    names = np.empty((1, len(class_names)), dtype=object)
    names[0, :] = class_names
    savemat(root / "cars_annos.mat", {"annotations": annotations, "class_names": names})


def test_cars196_labels_are_class_minus_one_over_train_and_test(tmp_path):
    rows = [
        ("car_ims/000001.jpg", 2, 0),
        ("car_ims/000002.jpg", 1, 1),
        ("car_ims/000003.jpg", 3, 0),
        ("car_ims/000004.jpg", 1, 0),
        ("car_ims/000005.jpg", 3, 1),
        ("car_ims/000006.jpg", 2, 1),
    ]
    for i, (p, cls, _) in enumerate(rows):
        img(tmp_path / p, 30 * cls + i)
    _cars_annos(
        tmp_path, rows, ["AM General Hummer SUV 2000", "Acura RL Sedan 2012", "Acura TL Sedan 2012"]
    )
    ds = data.build("cars196", root=tmp_path)
    assert ds.labels.tolist() == [1, 0, 2, 0, 2, 1]
    assert ds.class_names == [
        "AM General Hummer SUV 2000",
        "Acura RL Sedan 2012",
        "Acura TL Sedan 2012",
    ]
    assert pixel(ds, 2)[0] == 30 * 3 + 2  # image order follows the annotation file


def _ebay(root: Path, name: str, rows: list[tuple[int, int, str]]) -> None:
    lines = ["image_id class_id super_class_id path"] + [f"{i} {c} 1 {p}" for i, c, p in rows]
    (root / name).write_text("\n".join(lines) + "\n")


def test_sop_concatenates_train_then_test_with_label_class_id_minus_one(tmp_path):
    train = [
        (1, 1, "bicycle_final/a_0.JPG"),
        (2, 1, "bicycle_final/a_1.JPG"),
        (3, 2, "bicycle_final/b_0.JPG"),
        (4, 2, "bicycle_final/b_1.JPG"),
    ]
    test = [(5, 3, "chair_final/c_0.JPG"), (6, 3, "chair_final/c_1.JPG")]
    for k, (_, c, p) in enumerate(train + test):
        img(tmp_path / p, 20 * c + k, fmt="JPEG")
    _ebay(tmp_path, "Ebay_train.txt", train)
    _ebay(tmp_path, "Ebay_test.txt", test)
    ds = data.build("sop", root=tmp_path)
    assert ds.labels.tolist() == [0, 0, 1, 1, 2, 2]
    assert ds.origins[4].endswith("chair_final/c_0.JPG")


def test_inshop_one_class_per_item_in_item_id_order(tmp_path):
    rows = [
        ("img/WOMEN/Dresses/id_00000002/02_1_front.jpg", "id_00000002", "train"),
        ("img/WOMEN/Dresses/id_00000002/02_2_side.jpg", "id_00000002", "train"),
        ("img/MEN/Denim/id_00000001/01_1_front.jpg", "id_00000001", "query"),
        ("img/MEN/Denim/id_00000001/01_2_side.jpg", "id_00000001", "gallery"),
    ]
    for k, (p, _, _) in enumerate(rows):
        img(tmp_path / p, 50 * k)
    text = [str(len(rows)), "image_name item_id evaluation_status"] + [" ".join(r) for r in rows]
    (tmp_path / "list_eval_partition.txt").write_text("\n".join(text) + "\n")
    ds = data.build("inshop", root=tmp_path)
    assert ds.labels.tolist() == [1, 1, 0, 0]
    assert ds.class_names == ["id_00000001", "id_00000002"]
    assert ds.partition == ["train", "train", "query", "gallery"]


def test_image_folder_sorts_classes_by_name_and_converts_modes(tmp_path):
    img(tmp_path / "zebra" / "1.png", 10, mode="L")
    img(tmp_path / "zebra" / "2.png", 20, mode="P")
    img(tmp_path / "apple" / "1.jpg", 30, mode="CMYK", fmt="JPEG")
    img(tmp_path / "apple" / "2.png", 40000, mode="I;16")
    (tmp_path / "apple" / "notes.txt").write_text("not an image")
    ds = data.build("image_folder", root=tmp_path)
    assert ds.class_names == ["apple", "zebra"] and ds.labels.tolist() == [0, 0, 1, 1]
    assert all(ds[i][0].mode == "RGB" for i in range(len(ds)))


# --- Omniglot ----------------------------------------------------------------------------------


def _omniglot_tree(base: Path) -> None:
    for a in ("Latin", "Greek"):
        for ch in ("character02", "character01"):
            for d in range(2):
                img(
                    base / "images_background_small1" / a / ch / f"{a}{ch}_{d:02}.png",
                    10 * d,
                    mode="L",
                )


def test_omniglot_folder_and_zip_give_the_same_dataset(tmp_path):
    _omniglot_tree(tmp_path / "tree")
    archive = tmp_path / "omniglot.zip"
    with zipfile.ZipFile(archive, "w") as zf:
        for p in sorted((tmp_path / "tree").rglob("*.png")):
            zf.write(p, p.relative_to(tmp_path / "tree").as_posix())
    folder, zipped = (
        data.build("omniglot", root=tmp_path / "tree"),
        data.build("omniglot", root=archive),
    )
    expected = ["Greek/character01", "Greek/character02", "Latin/character01", "Latin/character02"]
    assert folder.class_names == zipped.class_names == expected
    assert folder.labels.tolist() == zipped.labels.tolist() == [0, 0, 1, 1, 2, 2, 3, 3]
    for i in range(len(folder)):
        assert np.array_equal(np.asarray(folder[i][0]), np.asarray(zipped[i][0]))


def test_real_omniglot_subset(omniglot_zip):
    ds = data.build("omniglot", root=omniglot_zip)
    assert (len(ds), ds.num_classes) == (2720, 136)
    assert (ds.class_counts() == 20).all()
    assert ds.class_names[0] == "Balinese/character01" and ds.class_names == sorted(ds.class_names)
    image, label = ds[0]
    assert image.size == (105, 105) and image.mode == "RGB" and label == 0


# --- embedded default --------------------------------------------------------------------------


def test_glyphs_is_deterministic_and_has_enough_distinct_classes():
    ds = data.build("glyphs")
    assert ds.num_classes == len(G.CHARACTERS) == 111 >= 100
    assert (ds.class_counts() == len(G.FONT_FILES)).all() and len(G.FONT_FILES) >= 10
    a = np.stack([np.asarray(ds[i][0]) for i in range(len(ds))])
    assert a.shape == (111 * 16, 64, 64, 3)
    G._render_all.cache_clear()
    b = np.stack([np.asarray(im) for im in data.build("glyphs").sources])
    assert np.array_equal(a, b)  # rebuilt from the fonts: bit-identical
    ink = (a < 128).any(axis=3).sum(axis=(1, 2))
    assert ink.min() > 10  # no blank image
    first_of_class = a[:: len(G.FONT_FILES)]
    assert len({im.tobytes() for im in first_of_class}) == 111
    q = G.class_order().index("Q")
    direct = G.render_glyph("Q", G.FONT_FILES[3], 64, np.random.default_rng((0, q, 3)))
    assert np.array_equal(direct, a[q * 16 + 3])
    assert sorted(G.class_order()) == sorted(G.CHARACTERS)  # a permutation
    halves = G.class_order()[:55], G.class_order()[55:]
    assert all(any(c.isupper() for c in h) and any(c.isdigit() for c in h) for h in halves)


def test_glyphs_feed_a_dataloader_with_a_torchvision_transform():
    ds = data.build("glyphs")
    ds.transform = transforms.Compose(
        [transforms.RandomResizedCrop(32, scale=(0.5, 1)), transforms.ToTensor()]
    )
    x, y = next(iter(torch.utils.data.DataLoader(ds, batch_size=8, shuffle=True)))
    assert x.shape == (8, 3, 32, 32) and y.dtype == torch.int64


# --- bad data: one clear error naming the path -------------------------------------------------


@pytest.mark.parametrize("name", ["cub200", "cars196", "sop", "inshop", "image_folder", "omniglot"])
def test_missing_root(tmp_path, name):
    with pytest.raises(DatasetError, match=str(tmp_path / "nope")):
        data.build(name, root=tmp_path / "nope")


@pytest.mark.parametrize(
    ("name", "missing"),
    [
        ("cars196", "cars_annos.mat"),
        ("sop", "Ebay_train.txt"),
        ("inshop", "list_eval_partition.txt"),
        ("cub200", "images"),
    ],
)
def test_missing_annotation_file(tmp_path, name, missing):
    with pytest.raises(DatasetError, match=f"{tmp_path}.*{missing}.*not found"):
        data.build(name, root=tmp_path)


def test_empty_class_folder(tmp_path):
    img(tmp_path / "a" / "1.png", 1)
    (tmp_path / "b").mkdir()
    with pytest.raises(DatasetError, match=f"{tmp_path / 'b'}: class folder has no images"):
        data.build("image_folder", root=tmp_path)


def test_zero_byte_image_is_found_at_load(tmp_path):
    img(tmp_path / "a" / "1.png", 1)
    (tmp_path / "a" / "2.png").write_bytes(b"")
    with pytest.raises(DatasetError, match=f"{tmp_path / 'a' / '2.png'}: image file is empty"):
        data.build("image_folder", root=tmp_path)


def test_corrupt_image_is_reported_with_its_path_at_first_read(tmp_path):
    img(tmp_path / "a" / "1.png", 1)
    good = img(tmp_path / "a" / "2.jpg", 2, fmt="JPEG").read_bytes()
    (tmp_path / "a" / "2.jpg").write_bytes(good[: len(good) // 3])  # truncated JPEG
    ds = data.build("image_folder", root=tmp_path)
    with pytest.raises(
        DatasetError, match=f"{tmp_path / 'a' / '2.jpg'}: unreadable or corrupt image"
    ):
        for _ in torch.utils.data.DataLoader(ds, batch_size=1, collate_fn=lambda b: b):
            pass


def test_annotation_path_escaping_the_root_is_refused(tmp_path):
    img(tmp_path / "outside.jpg", 1)
    root = tmp_path / "sop"
    root.mkdir()
    _ebay(root, "Ebay_train.txt", [(1, 1, "../outside.jpg")])
    _ebay(root, "Ebay_test.txt", [])
    with pytest.raises(DatasetError, match="Ebay_train.txt: path '../outside.jpg' points outside"):
        data.build("sop", root=root)


def test_annotation_listing_a_missing_image(tmp_path):
    _ebay(tmp_path, "Ebay_train.txt", [(1, 1, "x/missing.JPG")])
    _ebay(tmp_path, "Ebay_test.txt", [])
    with pytest.raises(
        DatasetError, match="missing.JPG: image file listed by the dataset is missing"
    ):
        data.build("sop", root=tmp_path)


def test_bad_header_and_bad_mat(tmp_path):
    (tmp_path / "Ebay_train.txt").write_text("id class path\n1 1 a.jpg\n")
    (tmp_path / "Ebay_test.txt").write_text("")
    with pytest.raises(DatasetError, match="Ebay_train.txt: expected the header line"):
        data.build("sop", root=tmp_path)
    (tmp_path / "cars_annos.mat").write_bytes(b"MATLAB? no")
    with pytest.raises(DatasetError, match="cars_annos.mat: not a valid cars_annos.mat"):
        data.build("cars196", root=tmp_path)


def test_not_a_zip(tmp_path):
    (tmp_path / "omniglot.zip").write_bytes(b"PK garbage")
    with pytest.raises(DatasetError, match="omniglot.zip: not a readable zip file"):
        data.build("omniglot", root=tmp_path / "omniglot.zip")
