"""One registry class for every kind of plug-in (dataset, loss, miner, sampler, strategy, trunk).

An entry is a factory plus metadata (timm's model: registration carries the metadata, lookups
read it): its keyword-only parameters and their defaults, their declared types
(:mod:`mlrc.params`), the docstring's first line, an optional search space and whatever
the kind adds (a loss's batch kind, see ``LossInfo``). Each kind keeps thin module-level
functions (``losses.build``, ``miners.params``, ...) that call its registry.

Where entries come from:

* modules inside mlrc: a kind's package imports all its modules (:func:`import_submodules`),
  so a new module registers itself — there is no list of imports to keep;
* other installed distributions, through the entry-point group of the kind (``mlrc.losses``,
  ``mlrc.miners``, ``mlrc.strategies``, ``mlrc.samplers``, ``mlrc.trunks``, ``mlrc.datasets``),
  read once, at the first lookup. An entry point names a module that registers on import, or a
  callable taking no arguments that registers when called. One that fails is skipped with a
  one-line warning naming the distribution and the entry point.

Each entry remembers where it came from (:meth:`Registry.source`): ``mlrc`` for the built-ins,
the distribution's name for one registered while its entry point loads (else the distribution
that installed the registering module, else that module's top-level package).

An entry's search space is ``register(..., space=...)`` (a path, an ``importlib.resources``
traversable, or ``"package:file.yaml"``), else a ``<name>.yaml`` beside the registering module,
else ``spaces/<name>.yaml`` beside it (found through ``importlib.resources``). The built-ins use
the last: ``mlrc/methods/losses/spaces/<loss>.yaml``, ``mlrc/methods/miners/spaces/``,
``mlrc/methods/strategies/spaces/``; :func:`mlrc.config.default_space` reads the file.
"""

from __future__ import annotations

import difflib
import importlib
import inspect
import logging
import pkgutil
import sys
from collections.abc import Callable
from dataclasses import dataclass, field
from importlib.metadata import entry_points, packages_distributions
from importlib.resources import files
from importlib.resources.abc import Traversable
from pathlib import Path
from typing import Any, Generic, TypeVar

from mlrc.params import ParamType, declared_types

T = TypeVar("T")
log = logging.getLogger("mlrc")


class RegistryError(KeyError):
    """An unknown name was asked of a registry."""

    def __str__(self) -> str:  # KeyError quotes its message; we want it plain
        return str(self.args[0])


@dataclass(frozen=True, kw_only=True)
class Entry:
    """A registered factory and what mlrc needs to know about it without calling it.

    ``params``: keyword-only parameters (but the kind's fixed ones) and their defaults;
    ``types``: their declared types; ``space``: the plug-in's search space as given to
    ``register`` (None → a ``<name>.yaml`` beside the module, if any)."""

    name: str
    factory: Callable[..., Any]
    params: dict[str, Any] = field(default_factory=dict)
    types: dict[str, ParamType] = field(default_factory=dict)
    doc: str = ""
    space: str | Path | Traversable | None = None


E = TypeVar("E", bound=Entry)


def import_submodules(package: str) -> list[str]:
    """Import every module of ``package`` (names starting with ``_`` skipped), in name order, so
    each registers itself; returns their full names."""
    pkg = importlib.import_module(package)
    names = sorted(
        f"{package}.{m.name}"
        for m in pkgutil.iter_modules(pkg.__path__)
        if not m.name.startswith("_")
    )
    for name in names:
        importlib.import_module(name)
    return names


class Registry(Generic[T]):
    """Name → :class:`Entry` (or the kind's subclass ``entry``). ``@registry.register("name")``
    adds one; ``group`` is the entry-point group other distributions register through;
    ``fixed`` are keyword arguments mlrc itself passes (not the study's parameters)."""

    def __init__(
        self,
        kind: str,
        *,
        group: str | None = None,
        entry: type[Entry] = Entry,
        fixed: tuple[str, ...] = (),
    ) -> None:
        self.kind = kind
        self.group = group
        self.entry_type = entry
        self.fixed = fixed
        self._entries: dict[str, Entry] = {}
        self._sources: dict[str, str] = {}  # name → distribution whose entry point registered it
        self._loading: str | None = None  # the distribution whose entry point is loading now
        self._plugins_loaded = group is None

    # --- adding and removing ---------------------------------------------------------------

    def register(self, name: str, factory: Callable[..., T] | None = None, /, **meta: Any) -> Any:
        """``@registry.register(name, **meta)`` (or ``registry.register(name, factory, **meta)``);
        ``meta`` are the entry type's extra fields (e.g. ``batch=`` for a loss) and ``space=``."""

        def decorate(factory: Callable[..., T]) -> Callable[..., T]:
            if name in self._entries:
                raise ValueError(f"{self.kind} {name!r} is registered twice")
            sig = inspect.signature(factory)
            params = {
                k: p.default
                for k, p in sig.parameters.items()
                if p.kind == p.KEYWORD_ONLY and k not in self.fixed
            }
            doc = (factory.__doc__ or "").strip()
            self._entries[name] = self.entry_type(
                name=name,
                factory=factory,
                params=params,
                types=declared_types(factory, skip=self.fixed),
                doc=doc.splitlines()[0] if doc else "",
                **meta,
            )
            if self._loading is not None:
                self._sources[name] = self._loading
            return factory

        return decorate if factory is None else decorate(factory)

    def unregister(self, name: str) -> None:
        """Remove ``name`` if registered (tests register throwaway plug-ins)."""
        self._entries.pop(name, None)
        self._sources.pop(name, None)

    # --- lookups ---------------------------------------------------------------------------

    def available(self) -> list[str]:
        self.load_plugins()
        return sorted(self._entries)

    def info(self, name: str) -> Any:
        """The entry of ``name`` (its kind's entry type); RegistryError naming the close ones."""
        self.load_plugins()
        try:
            return self._entries[name]
        except KeyError:
            close = difflib.get_close_matches(name, self._entries, n=1)
            hint = f"; did you mean {close[0]!r}?" if close else ""
            raise RegistryError(
                f"unknown {self.kind} {name!r}{hint} (available: {', '.join(self.available())})"
            ) from None

    def get(self, name: str) -> Callable[..., T]:
        """The factory of ``name``."""
        return self.info(name).factory

    def params(self, name: str) -> dict[str, Any]:
        """Accepted parameters of ``name`` and their defaults."""
        return dict(self.info(name).params)

    def param_types(self, name: str) -> dict[str, ParamType]:
        """Declared type (and range) of each parameter of ``name``."""
        return dict(self.info(name).types)

    def build(self, name: str, /, *args: Any, **kwargs: Any) -> T:
        """``factory(*args, **kwargs)``; a keyword the factory does not take is a TypeError naming
        the accepted parameters (a factory with ``**kwargs`` checks its own)."""
        spec = self.info(name)
        sig = inspect.signature(spec.factory).parameters
        if not any(p.kind is p.VAR_KEYWORD for p in sig.values()):
            unknown = sorted(set(kwargs) - set(sig))
            if unknown:
                raise TypeError(
                    f"{self.kind} {name!r} takes no parameter {', '.join(map(repr, unknown))} "
                    f"(it takes: {', '.join(spec.params) or 'none'})"
                )
        return spec.factory(*args, **kwargs)

    def source(self, name: str) -> str:
        """Where ``name`` came from: ``"mlrc"`` for a built-in, else the distribution whose entry
        point registered it, else the distribution that installed its factory's module, else that
        module's top-level package (a module on ``sys.path`` that no distribution installed)."""
        entry = self.info(name)  # RegistryError for an unknown name
        if name in self._sources:
            return self._sources[name]
        return _distribution_of(getattr(entry.factory, "__module__", "") or "")

    def space(self, name: str) -> Traversable | Path | None:
        """The entry's search-space file: ``space=`` of ``register``, else ``<name>.yaml`` beside
        the registering module, else ``spaces/<name>.yaml`` beside it (where the built-ins keep
        theirs); None when there is none (or ``name`` is unknown)."""
        try:
            spec = self.info(name)
        except RegistryError:
            return None
        given = spec.space
        if isinstance(given, str) and ":" in given and not Path(given).is_absolute():
            package, _, resource = given.partition(":")
            return files(package).joinpath(resource)
        if isinstance(given, str):
            return Path(given)
        if given is not None:
            return given
        module = sys.modules.get(getattr(spec.factory, "__module__", ""), None)
        if module is None:
            return None
        if hasattr(module, "__path__"):
            beside: Traversable | Path = files(module.__name__)
        elif module.__package__:
            beside = files(module.__package__)
        elif getattr(module, "__file__", None):
            beside = Path(module.__file__).parent
        else:
            return None
        for candidate in (
            beside.joinpath(f"{name}.yaml"),
            beside.joinpath("spaces").joinpath(f"{name}.yaml"),
        ):
            if candidate.is_file():
                return candidate
        return None

    # --- plug-ins from other distributions ------------------------------------------------

    def load_plugins(self) -> None:
        """Load the entry points of ``group`` (once); a failing one is a one-line warning."""
        if self._plugins_loaded:
            return
        self._plugins_loaded = True  # before loading: a plug-in may look entries up itself
        for ep in entry_points(group=self.group):
            dist = getattr(getattr(ep, "dist", None), "name", None)
            self._loading = dist
            try:
                obj = ep.load()
                if callable(obj) and not inspect.ismodule(obj):
                    obj()
            except Exception as e:  # noqa: BLE001 — a broken plug-in must not stop mlrc
                dist = dist or "unknown distribution"
                lines = [ln.strip() for ln in str(e).splitlines() if ln.strip()]
                log.warning(
                    "%s plug-in %r of %s not loaded (entry point %s in %s): %s%s",
                    self.kind,
                    ep.name,
                    dist,
                    ep.value,
                    self.group,
                    type(e).__name__,
                    f": {lines[0]}" if lines else "",
                )
            finally:
                self._loading = None


def _distribution_of(module: str) -> str:
    """``"mlrc"`` for mlrc's own modules; else the installed distribution that provides the
    top-level package of ``module`` (its name as installed), else that package's name."""
    top = module.partition(".")[0]
    if top == "mlrc":
        return "mlrc"
    dists = packages_distributions().get(top, [])
    return dists[0] if dists else top or "unknown"
