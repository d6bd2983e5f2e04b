"""``glyphs``: the embedded default dataset — printed characters rendered from installed fonts.

In the spirit of notMNIST: one class per character, one image per typeface. It needs no files and
no network, only the TrueType fonts that matplotlib (a dependency) ships in ``mpl-data/fonts/ttf``.

- Classes (111): A–Z, a–z, 0–9, the ten Greek capitals that do not look like Latin ones
  (Γ Δ Θ Λ Ξ Π Σ Φ Ψ Ω), 23 Greek small letters (α–ω without omicron), and
  & @ # $ % ? ! § ¶ ß € £ ¥ ÷ × ∂. Labels follow a fixed shuffle of that list
  (``class_order()``, numpy seed 2020), so the protocol's two class halves both mix scripts.
- Images per class (16): one per typeface — DejaVu Sans, DejaVu Sans Mono and DejaVu Serif
  (regular, bold, oblique/italic, bold oblique/italic each) and STIX General (regular, bold,
  italic, bold italic).
- Each image is ``size`` × ``size`` px (default 64), black glyph on white, RGB. The glyph sits on
  a fixed baseline (so "o" and "O" differ by size as in print) and gets a small deterministic
  jitter drawn from ``numpy.random.default_rng((seed, class, font))``: rotation ±8°, font size
  ×0.85–1.10, shift ±6% of the image per axis.

Same seed, size, Pillow and matplotlib versions → bit-identical images. Building all 1,776 images
takes well under a second; they are kept in memory.
"""

from __future__ import annotations

import string
from functools import lru_cache
from pathlib import Path

import numpy as np
from PIL import Image, ImageDraw, ImageFont

from mlrc.data.base import DatasetError, ImageDataset, register

CHARACTERS = (
    string.ascii_uppercase
    + string.ascii_lowercase
    + string.digits
    + "ΓΔΘΛΞΠΣΦΨΩ"
    + "αβγδεζηθικλμνξπρστυφχψω"
    + "&@#$%?!§¶ß€£¥÷×∂"
)

FONT_FILES = (
    "DejaVuSans.ttf",
    "DejaVuSans-Bold.ttf",
    "DejaVuSans-Oblique.ttf",
    "DejaVuSans-BoldOblique.ttf",
    "DejaVuSansMono.ttf",
    "DejaVuSansMono-Bold.ttf",
    "DejaVuSansMono-Oblique.ttf",
    "DejaVuSansMono-BoldOblique.ttf",
    "DejaVuSerif.ttf",
    "DejaVuSerif-Bold.ttf",
    "DejaVuSerif-Italic.ttf",
    "DejaVuSerif-BoldItalic.ttf",
    "STIXGeneral.ttf",
    "STIXGeneralBol.ttf",
    "STIXGeneralItalic.ttf",
    "STIXGeneralBolIta.ttf",
)


def font_dir() -> Path:
    import matplotlib

    return Path(matplotlib.get_data_path()) / "fonts" / "ttf"


def render_glyph(char: str, font_file: str, size: int, rng: np.random.Generator) -> np.ndarray:
    """One glyph as a (size, size, 3) uint8 array, black on white, jittered by ``rng``."""
    scale = rng.uniform(0.85, 1.10)
    angle = rng.uniform(-8.0, 8.0)  # degrees, counter-clockwise
    dx, dy = rng.uniform(-0.06, 0.06, size=2) * size
    font = ImageFont.truetype(str(font_dir() / font_file), size=max(4, round(0.62 * size * scale)))
    canvas = Image.new("L", (size, size), color=255)
    ImageDraw.Draw(canvas).text((size / 2, 0.74 * size), char, font=font, fill=0, anchor="ms")
    canvas = canvas.rotate(
        angle, resample=Image.Resampling.BILINEAR, translate=(dx, dy), fillcolor=255
    )
    return np.asarray(canvas.convert("RGB"))


def class_order() -> str:
    """The characters in label order: a fixed shuffle (seed 2020) of ``CHARACTERS``, so that the
    protocol's train+val half and test half both mix Latin, digits, Greek and symbols."""
    return "".join(
        np.asarray(list(CHARACTERS))[np.random.default_rng(2020).permutation(len(CHARACTERS))]
    )


@lru_cache(maxsize=4)
def _render_all(size: int, seed: int) -> tuple[np.ndarray, np.ndarray]:
    images, labels = [], []
    for c, char in enumerate(class_order()):
        for f, font_file in enumerate(FONT_FILES):
            images.append(render_glyph(char, font_file, size, np.random.default_rng((seed, c, f))))
            labels.append(c)
    stack = np.stack(images)
    stack.setflags(write=False)
    return stack, np.asarray(labels, dtype=np.int64)


def glyphs_dataset(size: int = 64, seed: int = 0) -> ImageDataset:
    """The ``glyphs`` dataset: 111 classes × 16 images of ``size`` px (see module docstring)."""
    missing = [f for f in FONT_FILES if not (font_dir() / f).is_file()]
    if missing:
        raise FileNotFoundError(f"{font_dir()}: matplotlib fonts missing for 'glyphs': {missing}")
    images, labels = _render_all(int(size), int(seed))
    names = [f"U+{ord(ch):04X} {ch}" for ch in class_order()]
    origins = [f"glyphs:{names[y]}:{FONT_FILES[i % len(FONT_FILES)]}" for i, y in enumerate(labels)]
    return ImageDataset("glyphs", list(images), labels, names, origins=origins)


@register("glyphs")
def glyphs(root: str | Path | None = None, **kwargs: object) -> ImageDataset:
    """The embedded default (no files, no network): see ``mlrc.data.glyphs``."""
    if root is not None:
        raise DatasetError("dataset 'glyphs' is built in and takes no root")
    return glyphs_dataset(**kwargs)
