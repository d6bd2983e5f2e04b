"""Every read of a trunk's weights file: checksums, downloads, reading and matching state dicts.

Conventions
-----------
* A weights file is a state dict (parameter name → tensor) in a torch file (read with
  ``torch.load(..., map_location="cpu", weights_only=True)``: no pickled code runs) or, for timm
  trunks, a ``.safetensors`` file. Checksums are SHA-256, hex; an expected value may be a prefix.
* Downloads go to :func:`weights_cache_dir` (``$MLRC_CACHE/weights``, see :mod:`mlrc.paths`) or
  :func:`mlrc.paths.timm_weights_dir`, once: pooch keeps the cache (a file is fetched only when
  absent, under a temporary name, and renamed when complete) and torch.hub's downloader moves
  the bytes, checking the expected SHA-256 prefix before the file is kept.
* Classifier heads are dropped before loading (:data:`HEAD_PREFIXES` for the built-in trunks,
  the pretrained config's ``classifier`` for timm models); everything else must match the model
  exactly, names and shapes (:func:`state_dict_mismatch`).
* Every problem is a one-line ``ValueError`` naming the file or the URL.

timm is imported only to read a timm trunk's weights (it takes seconds to import).
"""

from __future__ import annotations

import hashlib
import os
import re
import sys
import warnings
from collections.abc import Mapping, Set
from pathlib import Path
from typing import Any

import torch
from torch import Tensor, nn

from mlrc import paths
from mlrc.errors import first_line
from mlrc.models.base import TRUNKS

__all__ = [
    "HEAD_PREFIXES",
    "check_sha256",
    "check_state_dict",
    "check_weights",
    "download",
    "file_sha256",
    "fit_state_dict",
    "load_timm_weights",
    "load_weights",
    "read_state_dict",
    "state_dict_mismatch",
    "weights_cache_dir",
    "without_head",
]

#: State-dict prefixes of ImageNet classifier heads; dropped before loading into a trunk.
HEAD_PREFIXES: tuple[str, ...] = ("last_linear.", "fc.")

#: Wrappers of a checkpoint's state dict, unwrapped (the first found) when reading a timm file.
_WRAPPERS = ("state_dict", "model", "state_dict_ema")


def weights_cache_dir() -> Path:
    """Download cache: ``$MLRC_CACHE/weights``, :func:`mlrc.paths.weights_dir`."""
    return paths.weights_dir()


# --------------------------------------------------------------------------------------------
# Checksums and downloads


def file_sha256(path: str | os.PathLike[str]) -> str:
    """The SHA-256 of a file, hex."""
    import pooch  # 0.3 s to import: only when a file is checked

    return str(pooch.file_hash(str(path), alg="sha256"))


def check_sha256(path: Path, expected: str | None) -> None:
    """ValueError naming ``path`` unless its SHA-256 starts with ``expected`` (any case);
    nothing to check for ``expected`` empty or None."""
    if not expected:
        return
    got = file_sha256(path)
    if not got.startswith(expected.lower()):
        raise ValueError(f"weights file {path} has SHA-256 {got}, expected {expected.lower()}")


def download(url: str, path: Path, *, sha256_prefix: str | None = None) -> Path:
    """``url`` as the file ``path``, fetched once (an existing file is used as it is); returns
    ``path``. pooch keeps the cache; the transfer is torch.hub's downloader (urllib, no progress
    bar), which checks that the file's SHA-256 starts with ``sha256_prefix`` (None: no check)
    before the file is kept. A one-line ValueError naming the URL and the cache folder for a
    network error, a checksum mismatch or a disk error."""
    import pooch  # 0.3 s to import: only for a download

    def transfer(url: str, output_file: str, _pooch: object) -> None:
        torch.hub.download_url_to_file(url, output_file, sha256_prefix, progress=False)

    logger = pooch.get_logger()
    level = logger.level
    logger.setLevel("WARNING")  # no "Downloading data from ..." line on stderr
    try:
        pooch.retrieve(url, None, fname=path.name, path=path.parent, downloader=transfer)
    except Exception as exc:  # network, hash mismatch, disk
        raise ValueError(
            f"could not get weights {url} (cache {path.parent}): {type(exc).__name__}: "
            f"{first_line(exc, '(no message)')} (download it by hand and pass its local path instead)"
        ) from exc
    finally:
        logger.setLevel(level)
    return path


# --------------------------------------------------------------------------------------------
# Reading and matching state dicts


def check_state_dict(obj: object, source: str) -> Mapping[str, Tensor]:
    """``obj`` if it is a non-empty flat mapping of name to tensor, else a one-line ValueError
    naming ``source`` (the file or URL it was read from)."""
    if not isinstance(obj, Mapping) or not obj:
        raise ValueError(
            f"weights {source} are not a state dict (got {type(obj).__name__}); "
            "expected a flat mapping of parameter name to tensor"
        )
    for k, v in obj.items():
        if not isinstance(k, str) or not isinstance(v, Tensor):
            raise ValueError(
                f"weights {source} are not a state dict: entry {k!r} is "
                f"{type(v).__name__}, expected a tensor under a string name"
            )
    return obj


def _torch_load(path: Path) -> object:
    return torch.load(path, map_location="cpu", weights_only=True)


def _read_checkpoint(path: Path) -> object:
    """A ``.safetensors`` or torch file's content, its state dict unwrapped (:data:`_WRAPPERS`)."""
    if path.suffix == ".safetensors":
        from safetensors.torch import load_file  # noqa: PLC0415 - only for a safetensors file

        obj: Any = load_file(str(path), device="cpu")
    else:
        obj = _torch_load(path)
    for wrapper in _WRAPPERS:
        if isinstance(obj, Mapping) and isinstance(obj.get(wrapper), Mapping):
            return obj[wrapper]
    return obj


def read_state_dict(path: str | os.PathLike[str], *, checkpoint: bool = False) -> dict[str, Tensor]:
    """The state dict in the file ``path`` (``~`` expanded), on the CPU.

    ``checkpoint`` false: a torch file holding the flat mapping itself (the built-in trunks);
    true (timm trunks): a ``.safetensors`` or torch file, a ``state_dict`` / ``model`` /
    ``state_dict_ema`` wrapper unwrapped and DDP / ``torch.compile`` name prefixes dropped
    (``timm.models.clean_state_dict``). A one-line ValueError naming the file when it is
    missing, empty, unreadable (corrupt, truncated, pickled code) or not a state dict.
    """
    path = Path(path).expanduser()
    if not path.is_file():
        raise ValueError(f"weights file {path} does not exist")
    if path.stat().st_size == 0:
        raise ValueError(f"weights file {path} is empty (0 bytes)")
    try:
        obj = _read_checkpoint(path) if checkpoint else _torch_load(path)
    except Exception as exc:  # corrupt, truncated, not a torch file, unsafe pickle
        kind = "state dict" if checkpoint else "torch state dict"
        raise ValueError(
            f"weights file {path} is not a readable {kind}: "
            f"{type(exc).__name__}: {first_line(exc, '(no message)')}"
        ) from exc
    state = check_state_dict(obj, str(path))
    if not checkpoint:
        return dict(state)
    from timm.models import clean_state_dict  # noqa: PLC0415 - seconds: only for timm weights

    return dict(clean_state_dict(dict(state)))


def _examples(keys: Set[str], n: int = 3) -> str:
    shown = ", ".join(sorted(keys)[:n])
    return shown + (", ..." if len(keys) > n else "")


def state_dict_mismatch(own: Mapping[str, Tensor], got: Mapping[str, Tensor]) -> str:
    """``""`` when ``got`` has exactly the names and shapes of ``own`` (a model's state dict),
    else what differs, in one line: missing and unexpected names, shapes (file vs model), the
    first three of each."""
    missing, unexpected = set(own) - set(got), set(got) - set(own)
    problems = [
        f"{len(keys)} {label} keys ({_examples(keys)})"
        for label, keys in (("missing", missing), ("unexpected", unexpected))
        if keys
    ]
    shapes = [
        f"{k} {tuple(got[k].shape)} vs {tuple(own[k].shape)}"
        for k in sorted(set(own) & set(got))
        if got[k].shape != own[k].shape
    ]
    if shapes:
        more = ", ..." if len(shapes) > 3 else ""
        problems.append(
            f"{len(shapes)} shape mismatches, file vs model ({', '.join(shapes[:3])}{more})"
        )
    return "; ".join(problems)


def without_head(
    state: Mapping[str, Tensor], prefixes: tuple[str, ...], keep: Set[str] = frozenset()
) -> dict[str, Tensor]:
    """``state`` without the names starting with one of ``prefixes`` (a classifier head), but
    those in ``keep`` (names the model itself has)."""
    return {k: v for k, v in state.items() if k in keep or not k.startswith(prefixes)}


def fit_state_dict(
    module: nn.Module, state: Mapping[str, Tensor], source: str
) -> dict[str, Tensor]:
    """Drop head keys (:data:`HEAD_PREFIXES`), fix legacy details, and check names/shapes;
    ValueError naming ``source`` on any mismatch.

    Legacy details tolerated: BatchNorm ``num_batches_tracked`` absent (checkpoints older than
    torch 0.4.1; the module's current counter is kept) and BatchNorm vectors stored as ``(1, C)``
    (some BN-Inception ports) instead of ``(C,)``.
    """
    own = module.state_dict()
    got = without_head(state, HEAD_PREFIXES)
    for k, v in own.items():
        if k.endswith("num_batches_tracked") and k not in got:
            got[k] = v
    for k in set(own) & set(got):
        want, have = own[k].shape, got[k].shape
        if len(want) == 1 and len(have) == 2 and have[0] == 1 and have[1] == want[0]:
            got[k] = got[k].reshape(want)
    problem = state_dict_mismatch(own, got)
    if problem:
        raise ValueError(f"weights {source} do not fit {type(module).__name__}: {problem}")
    return got


# --------------------------------------------------------------------------------------------
# The built-in trunks' weights


def _hub_state_dict(url: str, hash_prefix: str) -> tuple[Mapping[str, Tensor], str]:
    """The state dict at ``url`` (downloaded once into :func:`weights_cache_dir`) and the
    source its errors name; the file name must carry the sha-256 prefix ``hash_prefix``."""
    name = url.rsplit("/", 1)[-1]
    found = re.search(r"-([a-f0-9]+)\.", name)
    if not hash_prefix or found is None or not found.group(1).startswith(hash_prefix):
        raise ValueError(
            f"weights URL {url} does not carry the expected sha-256 prefix {hash_prefix!r} "
            "in its file name, so its download could not be checked"
        )
    cache = weights_cache_dir()
    source = f"{url} (cache {cache})"
    path = download(url, cache / name, sha256_prefix=found.group(1))
    try:
        obj = _torch_load(path)
    except Exception as exc:  # an unreadable download
        raise ValueError(
            f"could not get weights {source}: {type(exc).__name__}: {first_line(exc, '(no message)')} "
            "(download it by hand and pass its local path instead)"
        ) from exc
    return check_state_dict(obj, source), source


def load_weights(
    module: nn.Module, pretrained: bool | str | os.PathLike[str], url: str, hash_prefix: str
) -> None:
    """Load weights into ``module`` in place, strictly, after dropping classifier-head keys.

    ``pretrained``: ``False`` does nothing; a path loads that local state-dict file
    (:func:`read_state_dict`); ``True`` downloads ``url`` into :func:`weights_cache_dir` once
    (:func:`download`, as ``torch.hub.load_state_dict_from_url`` would, without its
    "Downloading" line), checking that the file's sha-256 starts with the hash in its name;
    ``hash_prefix`` must be that hash (a guard against a URL whose name carries no or another
    hash, which would not be checked).

    Raises ``ValueError`` with a one-line message naming the file for a missing or unreadable
    file, a file that is not a state dict, a failed download, or keys/shapes that don't match.
    """
    if pretrained is False:
        return
    if pretrained is True:
        state, source = _hub_state_dict(url, hash_prefix)
    elif isinstance(pretrained, str | os.PathLike):
        state, source = read_state_dict(pretrained), str(Path(pretrained).expanduser())
    else:
        raise ValueError(
            f"pretrained must be False, True or a path to a .pth file, not {pretrained!r}"
        )
    fitted = fit_state_dict(module, state, source)
    try:
        module.load_state_dict(fitted, strict=True)
    except RuntimeError as exc:  # should not happen after the checks above
        raise ValueError(
            f"weights {source} failed to load: {first_line(exc, '(no message)')}"
        ) from exc


def check_weights(name: str, pretrained: Any) -> None:
    """Resolve the weights trunk ``name`` loads for ``pretrained`` without building the trunk:
    its own factory runs on the meta device (parameters without memory or initialisation), so
    the file is found (for ``True``: downloaded into the cache first when absent, as a fold
    would), read, and its names and shapes matched against the trunk by the very code a fold
    runs; a missing or empty file, a failed download, a file that is no state dict or does not
    fit, or weights for a trunk that takes none is the same one-line ``ValueError``. A trunk
    that cannot be built on the meta device is built on the CPU instead; so is one whose meta
    check finds a mismatch (a timm checkpoint converter may need real tensors): the real load
    decides. ``pretrained`` false: nothing to resolve."""
    if pretrained is False or pretrained is None:
        return
    factory = TRUNKS.get(name)
    try:
        with torch.device("meta"):
            factory(pretrained=False)
    except Exception:  # noqa: BLE001 - no meta build for this trunk: the real one decides
        factory(pretrained=pretrained)
        return
    try:
        with torch.device("meta"), warnings.catch_warnings():
            warnings.simplefilter("ignore")  # loading into meta parameters is a no-op (warned)
            factory(pretrained=pretrained)
    except ValueError as e:
        if " do not fit " not in str(e):
            raise
        factory(pretrained=pretrained)


# --------------------------------------------------------------------------------------------
# timm trunks' weights


def _timm_download(url: str, sha256: str | None) -> Path:
    """``url`` in ``$MLRC_CACHE/weights/timm`` (:func:`download`, which checks ``sha256`` as a
    prefix); the file's path. Without ``sha256``, the first download's SHA-256 is kept in
    ``<file>.sha256`` and later loads are checked against it."""
    tail = url.split("?", 1)[0].rstrip("/").rsplit("/", 1)[-1] or "weights"
    key = hashlib.sha256(url.encode()).hexdigest()[:12]
    path = paths.timm_weights_dir() / f"{key}-{tail}"
    recorded = path.with_name(path.name + ".sha256")
    if not path.is_file():
        download(url, path, sha256_prefix=sha256)
        if not sha256:
            recorded.write_text(file_sha256(path) + "\n")
    if sha256:
        check_sha256(path, sha256)
    elif recorded.is_file():
        check_sha256(path, recorded.read_text().strip())
    return path


def _timm_weights_file(model: nn.Module, pretrained: Any, name: str) -> Path:
    """The (checked, downloaded) file ``pretrained`` names for the timm ``model`` ``name``."""
    if pretrained is True:
        cfg = getattr(model, "pretrained_cfg", None) or {}
        if cfg.get("hf_hub_id"):
            url = f"https://huggingface.co/{cfg['hf_hub_id']}/resolve/main/model.safetensors"
        elif cfg.get("url"):
            url = cfg["url"]
        else:
            raise ValueError(
                f"timm model {name!r} has no published weights; give pretrained a local file"
            )
        return _timm_download(url, None)
    if isinstance(pretrained, str | os.PathLike):
        return Path(pretrained).expanduser()
    if isinstance(pretrained, Mapping):
        sha = pretrained.get("sha256")
        if pretrained.get("url"):
            return _timm_download(str(pretrained["url"]), sha)
        path = Path(str(pretrained.get("file"))).expanduser()
        if not path.is_file():
            raise ValueError(f"weights file {path} does not exist")
        check_sha256(path, sha)
        return path
    raise ValueError(
        f"pretrained must be false, true, a path or {{file|url, sha256}}: {pretrained!r}"
    )


def _timm_head(model: nn.Module, state: Mapping[str, Tensor]) -> dict[str, Tensor]:
    """``state`` without the classifier its pretrained config names (but names ``model`` has)."""
    cfg = getattr(model, "pretrained_cfg", None) or {}
    heads = cfg.get("classifier") or ()
    heads = (heads,) if isinstance(heads, str) else tuple(heads)
    return without_head(state, tuple(f"{h}." for h in heads), keep=set(model.state_dict()))


def load_timm_weights(model: nn.Module, pretrained: Any, name: str) -> None:
    """Load ``pretrained`` (see :mod:`mlrc.models.timm_trunks`) into the timm ``model`` in
    place, strictly once its classifier head is dropped; a one-line ValueError naming the file.
    A checkpoint in the original authors' format is converted by the model family's own
    ``checkpoint_filter_fn`` when it does not match as it is."""
    if hasattr(pretrained, "model_dump"):  # the preset's {file|url, sha256} mapping
        pretrained = pretrained.model_dump()
    if pretrained is False or pretrained is None:
        return
    path = _timm_weights_file(model, pretrained, name)
    state = _timm_head(model, read_state_dict(path, checkpoint=True))
    problem = state_dict_mismatch(model.state_dict(), state)
    if problem:  # the original authors' format? the model family's own converter
        convert = getattr(sys.modules.get(type(model).__module__), "checkpoint_filter_fn", None)
        if convert is not None:
            try:
                converted = _timm_head(model, convert(dict(state), model))
            except Exception:  # noqa: BLE001 - a converter that does not apply: report the first
                converted = None
            if converted is not None and not state_dict_mismatch(model.state_dict(), converted):
                state, problem = converted, ""
    if problem:
        raise ValueError(f"weights {path} do not fit timm model {name!r}: {problem}")
    model.load_state_dict(state, strict=True)
