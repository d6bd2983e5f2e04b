"""Bad datasets on disk, built file by file in the loaders' real layouts, and what the user sees.

Every refusal is a ``DatasetError`` whose one-line message names the path and the problem;
odd-but-valid images come back as correct RGB (checked against numpy, not against Pillow);
datasets that load but can mislead a study get warnings from ``check_dataset``.
"""

from __future__ import annotations

import io
import os
import re
import resource
import struct
import time
import zipfile
import zlib
from pathlib import Path

import numpy as np
import pytest
from PIL import Image, ImageFile
from scipy.io import savemat

import mlrc
from mlrc import data
from mlrc.data.base import (
    MAX_IMAGE_PIXELS,
    MAX_WARNINGS_PER_CHECK,
    DatasetError,
    ImageDataset,
    check_dataset,
)

SOP_HEADER = "image_id class_id super_class_id path"
INSHOP_HEADER = "image_name item_id evaluation_status"


# --- builders: real files in the loaders' formats ----------------------------------------------


def save(path: Path, image: Image.Image | np.ndarray, **kwargs: object) -> Path:
    """Write an image (a PIL image or a uint8 array) with Pillow; format from the suffix."""
    path.parent.mkdir(parents=True, exist_ok=True)
    if isinstance(image, np.ndarray):
        image = Image.fromarray(image)
    image.save(path, **kwargs)
    return path


def photo(seed: int, size: tuple[int, int] = (24, 16)) -> np.ndarray:
    """Noise (so a JPEG's scan data fills most of the file, and no two seeds collide)."""
    return np.random.default_rng(seed).integers(0, 256, (size[1], size[0], 3), dtype=np.uint8)


def exactly(message: str) -> str:
    """A ``match=`` pattern for exactly this one-line message."""
    return f"^{re.escape(message)}$"


def starts(message: str) -> str:
    return f"^{re.escape(message)}"


def make_images(root: Path, paths: list[str]) -> None:
    """A distinct small JPEG at each plain relative path that does not exist yet."""
    for p in paths:
        plain = "\0" not in p and ".." not in p and not Path(p).is_absolute()
        if plain and not os.path.lexists(root / p):
            save(root / p, photo(zlib.crc32(p.encode())), format="JPEG")


def sop_tree(
    root: Path, rows: list[tuple[int, str]], test_rows: list[tuple[int, str]] = ()
) -> Path:
    """``Ebay_train.txt`` / ``Ebay_test.txt`` listing (class_id, path), and their images."""
    root.mkdir(parents=True, exist_ok=True)
    for split, listed in (("Ebay_train.txt", rows), ("Ebay_test.txt", test_rows)):
        lines = [SOP_HEADER] + [f"{i} {c} 1 {p}" for i, (c, p) in enumerate(listed, 1)]
        (root / split).write_text("\n".join(lines) + "\n")
        make_images(root, [p for _, p in listed])
    return root


def inshop_tree(root: Path, rows: list[tuple[str, str]]) -> Path:
    """``list_eval_partition.txt`` listing (path, item_id); images made under the root."""
    root.mkdir(parents=True, exist_ok=True)
    lines = [str(len(rows)), INSHOP_HEADER] + [f"{p} {item} train" for p, item in rows]
    (root / "list_eval_partition.txt").write_text("\n".join(lines) + "\n")
    make_images(root, [p for p, _ in rows])
    return root


def cars_tree(root: Path, rows: list[tuple[str, int]], class_names: list[str]) -> Path:
    """``cars_annos.mat`` (MATLAB struct array, as in the official file) + images."""
    root.mkdir(parents=True, exist_ok=True)
    annotations = np.zeros((1, len(rows)), dtype=[("relative_im_path", "O"), ("class", "O")])
    for k, (p, cls) in enumerate(rows):
        annotations[0, k] = (np.array([p]), np.array([[cls]], dtype=np.uint8))
    make_images(root, [p for p, _ in rows])
    names = np.empty((1, len(class_names)), dtype=object)
    names[0, :] = class_names
    savemat(root / "cars_annos.mat", {"annotations": annotations, "class_names": names})
    return root


def folder_tree(root: Path, images: dict[str, int]) -> Path:
    """``root/<class>/<k>.jpg``: ``images[class]`` distinct JPEGs per class."""
    for c, (name, n) in enumerate(images.items()):
        for k in range(n):
            save(root / name / f"{k}.jpg", photo(100 * c + k), format="JPEG")
    return root


def one_image(tmp_path: Path, name: str, image: Image.Image, **kwargs: object) -> ImageDataset:
    """An ``image_folder`` dataset holding just ``a/<name>``."""
    save(tmp_path / "root" / "a" / name, image, **kwargs)
    return data.build("image_folder", root=tmp_path / "root")


def truncated(path: Path) -> Path:
    """Cut a file in the middle of its pixel data."""
    raw = path.read_bytes()
    path.write_bytes(raw[: len(raw) // 2])
    return path


def png_bomb(path: Path, width: int, height: int) -> Path:
    """A valid 1-bit PNG of width × height zeros: ~0.2 MB on disk, ~1.2 GB decoded as RGB."""

    def chunk(kind: bytes, body: bytes) -> bytes:
        return (
            struct.pack(">I", len(body)) + kind + body + struct.pack(">I", zlib.crc32(kind + body))
        )

    z = zlib.compressobj(1)
    row = bytes(1 + (width + 7) // 8)  # filter byte + packed bits
    idat = b"".join(z.compress(row) for _ in range(height)) + z.flush()
    ihdr = struct.pack(">IIBBBBB", width, height, 1, 0, 0, 0, 0)
    path.write_bytes(
        b"\x89PNG\r\n\x1a\n" + chunk(b"IHDR", ihdr) + chunk(b"IDAT", idat) + chunk(b"IEND", b"")
    )
    return path


def jpeg_claiming(path: Path, width: int, height: int) -> Path:
    """A small real JPEG whose frame header (SOF0) claims width × height."""
    buf = io.BytesIO()
    Image.fromarray(photo(0, (32, 16))).save(buf, format="JPEG")
    raw = buf.getvalue()
    sof = raw.index(b"\xff\xc0")
    path.write_bytes(raw[: sof + 5] + struct.pack(">HH", height, width) + raw[sof + 9 :])
    return path


def max_rss_mb() -> float:
    return resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024


# --- roots and annotation files ----------------------------------------------------------------


@pytest.mark.parametrize("name", ["cub200", "cars196", "sop", "inshop", "image_folder", "omniglot"])
def test_root_that_is_a_file(tmp_path, name):
    root = tmp_path / "dataset.tar"
    root.write_bytes(b"not a folder")
    expected = f"{root}: {name} root is not a directory"
    if name == "omniglot":  # a file root is taken as the zip
        expected = f"{root}: not a readable zip file"
    with pytest.raises(DatasetError, match=starts(expected)):
        data.build(name, root=root)


@pytest.mark.parametrize("name", ["cub200", "cars196", "sop", "inshop", "image_folder"])
def test_no_root_given(name):
    with pytest.raises(DatasetError, match=starts(f"dataset '{name}' needs a root directory")):
        data.build(name)


def test_sop_with_only_the_train_list(tmp_path):
    root = sop_tree(tmp_path, [(1, "a/1.jpg")])
    (root / "Ebay_test.txt").unlink()
    with pytest.raises(
        DatasetError,
        match=exactly(f"{root / 'Ebay_test.txt'}: SOP annotation file Ebay_test.txt not found"),
    ):
        data.build("sop", root=root)


def test_annotation_file_that_is_a_directory(tmp_path):
    (tmp_path / "list_eval_partition.txt").mkdir()
    with pytest.raises(
        DatasetError,
        match=exactly(
            f"{tmp_path / 'list_eval_partition.txt'}: In-Shop annotation file "
            "list_eval_partition.txt is a directory, not a file"
        ),
    ):
        data.build("inshop", root=tmp_path)


@pytest.mark.parametrize(
    ("name", "table"), [("sop", "Ebay_train.txt"), ("inshop", "list_eval_partition.txt")]
)
def test_annotation_file_that_is_not_text(tmp_path, name, table):
    sop_tree(tmp_path, [(1, "a/1.jpg")])
    (tmp_path / table).write_bytes(b"\x89PNG\r\n\x1a\n\xff\xfe binary")
    with pytest.raises(DatasetError, match=starts(f"{tmp_path / table}: not a UTF-8 text file")):
        data.build(name, root=tmp_path)


def test_empty_inshop_list(tmp_path):
    (tmp_path / "list_eval_partition.txt").write_bytes(b"")
    with pytest.raises(DatasetError, match="list_eval_partition.txt: expected a count line"):
        data.build("inshop", root=tmp_path)


@pytest.mark.parametrize("class_id", ["x", "²", "-3"])
def test_sop_class_id_that_is_not_a_number(tmp_path, class_id):
    sop_tree(tmp_path, [(1, "a/1.jpg")])
    (tmp_path / "Ebay_train.txt").write_text(
        f"{SOP_HEADER}\n1 1 1 a/1.jpg\n2 {class_id} 1 a/1.jpg\n"
    )
    with pytest.raises(
        DatasetError, match=exactly(f"{tmp_path / 'Ebay_train.txt'}:3: expected '{SOP_HEADER}'")
    ):
        data.build("sop", root=tmp_path)


# --- annotation paths leading out of the root: refused -----------------------------------------


@pytest.fixture
def outside(tmp_path) -> Path:
    """A real image next to (not inside) the dataset root ``tmp_path/root``."""
    return save(tmp_path / "secret" / "s.jpg", photo(7), format="JPEG")


ESCAPES = {
    "dotdot": lambda root, outside: "../secret/s.jpg",
    "dotdot_deep": lambda root, outside: "../../../../../../etc/passwd",
    "dotdot_inside_then_out": lambda root, outside: "a/../../secret/s.jpg",
    "absolute": lambda root, outside: str(outside),
    "absolute_etc": lambda root, outside: "/etc/passwd",
}


def _symlinked_file(root: Path, outside: Path) -> str:
    (root / "a").mkdir(parents=True, exist_ok=True)
    (root / "a" / "link.jpg").symlink_to(outside)
    return "a/link.jpg"


def _symlinked_folder(root: Path, outside: Path) -> str:
    root.mkdir(parents=True, exist_ok=True)
    (root / "linked").symlink_to(outside.parent, target_is_directory=True)
    return "linked/s.jpg"


ESCAPES |= {"symlink_file": _symlinked_file, "symlink_folder": _symlinked_folder}


def _build_listing(name: str, root: Path, bad: str) -> None:
    """Build dataset ``name`` whose annotation file lists a good image, then ``bad``."""
    if name == "sop":
        sop_tree(root, [(1, "a/1.jpg"), (1, bad)])
    elif name == "inshop":
        inshop_tree(root, [("img/1.jpg", "id_1"), (bad, "id_1")])
    else:
        cars_tree(root, [("car_ims/1.jpg", 1), (bad, 1)], ["AM General Hummer SUV 2000"])
    data.build(name, root=root)


@pytest.mark.parametrize("escape", list(ESCAPES))
@pytest.mark.parametrize(
    ("name", "table"),
    [
        ("sop", "Ebay_train.txt"),
        ("inshop", "list_eval_partition.txt"),
        ("cars196", "cars_annos.mat"),
    ],
)
def test_annotation_path_leaving_the_root_is_refused(tmp_path, outside, name, table, escape):
    root = tmp_path / "root"
    bad = ESCAPES[escape](root, outside)
    target = Path("/etc/passwd") if "etc" in bad else outside
    with pytest.raises(DatasetError) as e:
        _build_listing(name, root, bad)
    assert str(e.value) == (
        f"{root / table}: path {bad!r} points outside the dataset root {root} "
        f"(resolves to {target.resolve()}); refused"
    )


@pytest.mark.parametrize("kind", ["symlink_loop", "nul_byte"])
def test_annotation_path_that_cannot_be_resolved(tmp_path, kind):
    root = tmp_path / "root"
    root.mkdir()
    if kind == "symlink_loop":
        (root / "loop.jpg").symlink_to(root / "loop.jpg")
        bad = "loop.jpg"
    else:
        bad = "a\0b.jpg"
    pattern = starts(f"{root / 'Ebay_train.txt'}: path {bad!r} cannot be resolved (")
    with pytest.raises(DatasetError, match=pattern):
        sop_tree(root, [(1, bad)])
        data.build("sop", root=root)


def test_symlinks_that_stay_inside_the_root_and_a_symlinked_root_are_fine(tmp_path):
    real = sop_tree(tmp_path / "real", [(1, "a/1.jpg"), (2, "a/2.jpg")])
    (real / "b").mkdir()
    (real / "b" / "alias.jpg").symlink_to(real / "a" / "2.jpg")
    (real / "Ebay_test.txt").write_text(f"{SOP_HEADER}\n3 2 1 b/alias.jpg\n")
    (tmp_path / "via-link").symlink_to(real, target_is_directory=True)
    ds = data.build("sop", root=tmp_path / "via-link")
    assert ds.labels.tolist() == [0, 1, 1]
    assert np.array_equal(np.asarray(ds[1][0]), np.asarray(ds[2][0]))


def test_folder_layouts_follow_symlinks(tmp_path, outside):
    """Decision: no annotation text can name a path there; the tree (e.g. a symlink farm) is the
    user's own, so a symlinked image or class folder is loaded like a real one."""
    root = folder_tree(tmp_path / "root", {"a": 1})
    (root / "a" / "farm.jpg").symlink_to(outside)
    (root / "b").symlink_to(outside.parent, target_is_directory=True)
    ds = data.build("image_folder", root=root)
    assert ds.class_names == ["a", "b"] and ds.labels.tolist() == [0, 0, 1]
    assert np.array_equal(np.asarray(ds[1][0]), np.asarray(ds[2][0]))


# --- files that are not (whole) images ---------------------------------------------------------


@pytest.mark.parametrize("suffix", [".jpg", ".png"])
def test_zero_byte_image_is_refused_when_the_dataset_is_built(tmp_path, suffix):
    root = sop_tree(tmp_path, [(1, "a/1.jpg"), (1, f"a/empty{suffix}")])
    (root / "a" / f"empty{suffix}").write_bytes(b"")
    with pytest.raises(
        DatasetError,
        match=exactly(f"{root / 'a' / f'empty{suffix}'}: image file is empty (0 bytes)"),
    ):
        data.build("sop", root=root)


@pytest.mark.parametrize("suffix", [".jpg", ".png"])
def test_image_emptied_after_the_build_fails_at_read(tmp_path, suffix):
    ds = one_image(tmp_path, f"1{suffix}", Image.fromarray(photo(1)))
    Path(ds.origins[0]).write_bytes(b"")
    with pytest.raises(
        DatasetError,
        match=starts(f"{ds.origins[0]}: unreadable or corrupt image (cannot identify image file"),
    ):
        ds[0]


@pytest.mark.parametrize("suffix", [".jpg", ".png"])
def test_truncated_image_fails_at_first_read_naming_the_file(tmp_path, suffix):
    ds = one_image(tmp_path, f"1{suffix}", Image.fromarray(photo(1, (64, 64))))
    truncated(Path(ds.origins[0]))
    with pytest.raises(
        DatasetError,
        match=starts(f"{ds.origins[0]}: unreadable or corrupt image (image file is truncated"),
    ):
        ds[0]


def test_text_file_named_like_an_image(tmp_path):
    root = folder_tree(tmp_path, {"a": 1})
    (root / "a" / "readme.jpg").write_text("this is not a JPEG\n")
    ds = data.build("image_folder", root=root)
    with pytest.raises(DatasetError, match=starts(f"{root / 'a' / 'readme.jpg'}: unreadable or")):
        ds[1]


def test_pillow_does_not_accept_truncated_images():
    """Pillow's default, and no mlrc module turns it on (it would pad truncated files with gray)."""
    assert ImageFile.LOAD_TRUNCATED_IMAGES is False
    package = Path(mlrc.__file__).parent
    setters = [
        str(p.relative_to(package))
        for p in package.rglob("*.py")
        if re.search(r"^\s*[\w.]*LOAD_TRUNCATED_IMAGES\s*=\s*True", p.read_text(), re.M)
    ]
    assert setters == []


def test_truncated_image_is_refused_even_if_other_code_allowed_them(tmp_path, monkeypatch):
    ds = one_image(tmp_path, "1.jpg", Image.fromarray(photo(1, (64, 64))))
    truncated(Path(ds.origins[0]))
    monkeypatch.setattr(ImageFile, "LOAD_TRUNCATED_IMAGES", True)
    with (
        pytest.warns(RuntimeWarning, match="LOAD_TRUNCATED_IMAGES was True; mlrc set it back"),
        pytest.raises(DatasetError, match="image file is truncated"),
    ):
        ds[0]
    assert ImageFile.LOAD_TRUNCATED_IMAGES is False


def test_hidden_files_and_macos_metadata_are_skipped(tmp_path):
    root = folder_tree(tmp_path / "tree", {"a": 2})
    (root / "a" / "._0.jpg").write_bytes(b"\x00\x05\x16\x07 AppleDouble")  # macOS resource fork
    (root / ".thumbnails").mkdir()
    save(root / ".thumbnails" / "0.jpg", photo(0), format="JPEG")
    ds = data.build("image_folder", root=root)
    assert ds.class_names == ["a"] and [Path(o).name for o in ds.origins] == ["0.jpg", "1.jpg"]

    archive = tmp_path / "omniglot.zip"
    with zipfile.ZipFile(archive, "w") as zf:
        for k in range(2):
            zf.write(root / "a" / f"{k}.jpg", f"small/Latin/character01/{k}.jpg")
        zf.writestr("__MACOSX/small/Latin/character01/._0.jpg", b"\x00\x05\x16\x07")
        zf.writestr("small/Latin/.DS_Store/x.png", b"junk")
    ds = data.build("omniglot", root=archive)
    assert ds.class_names == ["Latin/character01"] and len(ds) == 2
    assert all(ds[i][0].mode == "RGB" for i in range(2))


# --- every image mode → correct RGB (expected values computed with numpy) ----------------------


def _over_white(rgb: np.ndarray, alpha: np.ndarray) -> np.ndarray:
    a = alpha[..., None].astype(np.float64) / 255
    return np.round(rgb * a + 255 * (1 - a)).astype(np.uint8)


def _cmyk() -> tuple[Image.Image, np.ndarray, dict]:
    cmyk = np.array([30, 200, 60, 40], dtype=np.uint8)
    ink = cmyk[:3] / 255 * np.ones((16, 16, 1))
    rgb = np.round(255 * (1 - ink) * (1 - cmyk[3] / 255))
    return Image.new("CMYK", (16, 16), tuple(cmyk.tolist())), rgb, {"quality": 100}


def _gray16() -> tuple[Image.Image, np.ndarray, dict]:
    v = np.array([[0, 128, 257, 1000, 32767, 40000, 65000, 65535]] * 3, dtype=np.uint16)
    rgb = np.repeat(np.round(v / 65535 * 255)[..., None], 3, axis=2)
    return Image.fromarray(v), rgb, {}


def _palette_with_transparency() -> tuple[Image.Image, np.ndarray, dict]:
    palette = np.array([[200, 0, 0], [0, 0, 255], [10, 200, 30]], dtype=np.uint8)
    alpha = np.array([255, 0, 128], dtype=np.uint8)
    index = np.array([[0, 1, 2, 2, 1, 0]], dtype=np.uint8)
    im = Image.frombytes("P", index.shape[::-1], index.tobytes())
    im.putpalette(palette.reshape(-1).tolist())
    return im, _over_white(palette[index], alpha[index]), {"transparency": alpha.tobytes()}


def _gray_alpha() -> tuple[Image.Image, np.ndarray, dict]:
    la = np.stack(np.meshgrid(np.arange(0, 256, 32), np.arange(0, 256, 51)), axis=2).astype(
        np.uint8
    )
    rgb = _over_white(np.repeat(la[..., :1], 3, axis=2), la[..., 1])
    return Image.fromarray(la), rgb, {}


def _rgba() -> tuple[Image.Image, np.ndarray, dict]:
    rgba = np.random.default_rng(3).integers(0, 256, (6, 9, 4), dtype=np.uint8)
    rgba[0, :, 3] = 0
    rgba[1, :, 3] = 255
    return Image.fromarray(rgba), _over_white(rgba[..., :3], rgba[..., 3]), {}


def _one_bit() -> tuple[Image.Image, np.ndarray, dict]:
    bits = np.random.default_rng(4).integers(0, 2, (7, 13)).astype(bool)
    return Image.fromarray(bits), np.repeat(bits[..., None] * 255, 3, axis=2), {}


MODES = {
    "cmyk.jpg": ("CMYK", _cmyk, 2),  # lossy: within 2 levels
    "gray16.png": ("I;16", _gray16, 0),
    "palette_trns.png": ("P", _palette_with_transparency, 1),
    "gray_alpha.png": ("LA", _gray_alpha, 1),
    "rgba.png": ("RGBA", _rgba, 1),
    "one_bit.png": ("1", _one_bit, 0),
}


@pytest.mark.parametrize("name", list(MODES))
def test_image_mode_is_converted_to_the_right_rgb(tmp_path, name):
    mode, make, atol = MODES[name]
    image, expected, save_kwargs = make()
    ds = one_image(tmp_path, name, image, **save_kwargs)
    with Image.open(ds.origins[0]) as on_disk:
        assert on_disk.mode == mode  # the file really is what the case is about
    got = ds[0][0]
    assert got.mode == "RGB" and got.size == image.size
    diff = np.abs(np.asarray(got, dtype=np.int64) - expected.astype(np.int64))
    assert diff.max() <= atol


def test_sixteen_bit_gray_is_not_white(tmp_path):
    """Pillow's own convert("RGB") clips I;16 to 255: a mid-gray 16-bit image would be white."""
    ds = one_image(tmp_path, "mid.png", Image.fromarray(np.full((4, 4), 32896, dtype=np.uint16)))
    with Image.open(ds.origins[0]) as im:
        assert im.convert("RGB").getpixel((0, 0)) == (255, 255, 255)
    assert ds[0][0].getpixel((0, 0)) == (128, 128, 128)
    arrays = ImageDataset("arr", [np.full((2, 2), 65535, dtype=np.uint16)], [0], ["a"])
    assert arrays[0][0].getpixel((1, 1)) == (255, 255, 255)


# --- huge images: refused before decoding, or decoded when they are just wide -----------------


def test_image_20000_pixels_wide_but_short_is_decoded(tmp_path):
    strip = np.zeros((20, 20000, 3), dtype=np.uint8)
    strip[:, 10000:] = (0, 200, 100)
    ds = one_image(tmp_path, "strip.png", strip)
    image = ds[0][0]
    assert image.size == (20000, 20)
    assert image.getpixel((9999, 10)) == (0, 0, 0) and image.getpixel((10000, 10)) == (0, 200, 100)


@pytest.fixture(scope="module")
def bomb(tmp_path_factory) -> Path:
    return png_bomb(tmp_path_factory.mktemp("bomb") / "bomb.png", 20000, 20000)


@pytest.mark.parametrize("pil_limit", ["pillow-default", "pillow-limit-off"])
@pytest.mark.parametrize("kind", ["png", "jpeg"])
def test_20000_by_20000_image_is_refused_without_decoding(
    tmp_path, monkeypatch, bomb, kind, pil_limit
):
    root = tmp_path / "root"
    (root / "a").mkdir(parents=True)
    path = root / "a" / f"huge.{kind}"
    if kind == "png":
        path.symlink_to(bomb)
    else:
        jpeg_claiming(path, 20000, 20000)
    if pil_limit == "pillow-limit-off":  # some other code disabled Pillow's guard: ours holds
        monkeypatch.setattr(Image, "MAX_IMAGE_PIXELS", None)
    ds = data.build("image_folder", root=root)
    rss, start = max_rss_mb(), time.perf_counter()
    with pytest.raises(DatasetError) as e:
        ds[0]
    assert time.perf_counter() - start < 1.0 and max_rss_mb() - rss < 200
    message = str(e.value)
    assert message.startswith(f"{ds.origins[0]}: image too large to decode safely (")
    assert "400000000 pixels" in message and "\n" not in message
    if pil_limit == "pillow-limit-off":
        assert f"20000x20000 = 400000000 pixels, over the limit of {MAX_IMAGE_PIXELS}" in message


# --- check_dataset: loads, but would mislead a study --------------------------------------------


def test_clean_dataset_has_no_warnings(tmp_path):
    ds = data.build("image_folder", root=folder_tree(tmp_path, {"a": 2, "b": 3}))
    assert check_dataset(ds) == []


def test_single_image_class_is_flagged_in_training_classes_only(tmp_path):
    ds = data.build("image_folder", root=folder_tree(tmp_path, {"a": 2, "b": 2, "solo": 1}))
    flagged = [
        f"image_folder: training class 'solo' has a single image ({tmp_path / 'solo' / '0.jpg'}): "
        "it gives no positive pair"
    ]
    assert check_dataset(ds) == flagged  # no split given: every class trains
    assert check_dataset(ds, train_classes=[0, 2]) == flagged
    assert check_dataset(ds, train_classes=[0, 1]) == []  # a test class may have one image
    with pytest.raises(ValueError, match=r"train_classes \[3\] are not labels 0..2"):
        check_dataset(ds, train_classes=[0, 3])


def test_many_single_image_classes_are_capped(tmp_path):
    ds = data.build("image_folder", root=folder_tree(tmp_path, {f"c{k:02}": 1 for k in range(25)}))
    warnings = check_dataset(ds)
    assert len(warnings) == MAX_WARNINGS_PER_CHECK + 1
    assert warnings[-1] == "image_folder: … and 5 more training classes with a single image"


def test_duplicate_files_are_flagged_naming_both(tmp_path):
    root = folder_tree(tmp_path, {"cat": 2, "dog": 2})
    (root / "dog" / "copy_of_cat.jpg").write_bytes((root / "cat" / "1.jpg").read_bytes())
    same_size = bytearray((root / "dog" / "0.jpg").read_bytes())
    same_size[-3] ^= 0xFF  # same length, different bytes: not a duplicate
    (root / "dog" / "same_size.jpg").write_bytes(bytes(same_size))
    ds = data.build("image_folder", root=root)
    assert check_dataset(ds, train_classes=[0, 1]) == [
        f"image_folder: duplicate image: {root / 'dog' / 'copy_of_cat.jpg'} is identical to "
        f"{root / 'cat' / '1.jpg'} (in different classes 'cat' and 'dog')"
    ]


def test_file_listed_twice_is_flagged(tmp_path):
    root = sop_tree(tmp_path, [(1, "a/1.jpg"), (1, "a/2.jpg"), (1, "a/1.jpg")])
    ds = data.build("sop", root=root)
    assert check_dataset(ds) == [
        f"sop: duplicate image: {root.resolve() / 'a' / '1.jpg'} is listed twice (both in class '1')"
    ]


def test_duplicates_among_zip_members_and_arrays(tmp_path):
    a, b = photo(1), photo(2)
    ds = ImageDataset("arr", [a, b, a.copy()], [0, 1, 1], ["x", "y"], origins=["p", "q", "r"])
    assert check_dataset(ds, train_classes=[]) == [
        "arr: duplicate image: r is identical to p (in different classes 'x' and 'y')"
    ]
    blobs = ImageDataset("z", [b"12", b"34", b"34"], [0, 0, 0], ["x"], origins=["1", "2", "3"])
    assert check_dataset(blobs) == ["z: duplicate image: 3 is identical to 2 (both in class 'x')"]


# --- labels that are not 0..C−1 in the annotation files: renumbered in sorted order -------------


def test_sop_class_ids_not_contiguous(tmp_path):
    rows = [(100, "a/1.jpg"), (5, "a/2.jpg"), (10, "a/3.jpg"), (5, "a/4.jpg")]
    ds = data.build("sop", root=sop_tree(tmp_path, rows[:2], rows[2:]))
    assert ds.class_names == ["5", "10", "100"]  # numeric order, not "10" < "100" < "5"
    assert ds.labels.tolist() == [2, 0, 1, 0]


def test_cars_class_ids_not_contiguous_keep_their_names(tmp_path):
    names = [f"car {k}" for k in range(1, 10)]
    root = cars_tree(
        tmp_path, [("car_ims/1.jpg", 9), ("car_ims/2.jpg", 1), ("car_ims/3.jpg", 5)], names
    )
    ds = data.build("cars196", root=root)
    assert ds.class_names == ["car 1", "car 5", "car 9"] and ds.labels.tolist() == [2, 0, 1]


def test_inshop_item_ids_not_contiguous(tmp_path):
    rows = [
        ("img/1.jpg", "id_00000900"),
        ("img/2.jpg", "id_00000007"),
        ("img/3.jpg", "id_00000900"),
    ]
    ds = data.build("inshop", root=inshop_tree(tmp_path, rows))
    assert ds.class_names == ["id_00000007", "id_00000900"] and ds.labels.tolist() == [1, 0, 1]
