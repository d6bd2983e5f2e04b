"""Where a study's trials run: one interface, :class:`Backend`, and the table :data:`BACKENDS`
that ``mlrc study run --backend`` and ``mlrc campaign run --backend`` choose from.

- ``local`` (:mod:`~mlrc.search.backends.local`): this process claims and trains trials; several
  ``mlrc worker`` processes sharing a PostgreSQL store make a pool;
- ``ray`` (:mod:`~mlrc.search.backends.ray`): Ray Tune places the trials (and, with
  ``fold_parallel``, their folds) on a local or remote Ray cluster. Ray is optional: its module
  is imported only when this backend is used.

:mod:`~mlrc.search.backends.slurm` is not a ``--backend``: it starts pool workers on a Slurm
cluster (``mlrc slurm submit``), each of which runs the local backend against the shared store;
:mod:`~mlrc.search.backends.mps` shares one GPU between a job's workers (CUDA MPS).
"""

from __future__ import annotations

import logging
import os
from collections.abc import Iterator, Mapping
from contextlib import AbstractContextManager, contextmanager, nullcontext
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any, Protocol

from mlrc.search.backends.local import run_search
from mlrc.search.errors import StudyError

if TYPE_CHECKING:
    from mlrc.search.session import StudySession

__all__ = ["BACKENDS", "Backend", "LocalBackend", "RayBackend", "backend_named", "run_search"]


class Backend(Protocol):
    """A way to run a study's search. ``options``: the backend's own (for Ray: ``address``,
    ``max_concurrent``, ``cpus_per_trial``, ``gpus_per_trial``, ``fold_parallel``,
    ``scheduler``); a backend ignores those it does not know."""

    name: str

    def session(self, options: Mapping[str, Any], quiet: bool) -> AbstractContextManager[Any]:
        """What the backend holds across several studies (a campaign's): a Ray session."""
        ...

    def search(self, ctx: StudySession, options: Mapping[str, Any]) -> None:
        """Run the open study's remaining trials (resuming interrupted ones)."""
        ...

    def uses_this_process(self, options: Mapping[str, Any]) -> bool:
        """The trials train in this process's (or this machine's) devices and threads: the
        CLI then checks ``--device`` and takes a fair share of the CPU cores."""
        ...


@dataclass(frozen=True)
class LocalBackend:
    """This process claims and trains trials (:func:`~mlrc.search.backends.local.run_search`)."""

    name: str = "local"

    def session(self, options: Mapping[str, Any], quiet: bool) -> AbstractContextManager[Any]:
        return nullcontext()

    def search(self, ctx: StudySession, options: Mapping[str, Any]) -> None:
        run_search(ctx)

    def uses_this_process(self, options: Mapping[str, Any]) -> bool:
        return True


@dataclass(frozen=True)
class RayBackend:
    """Ray Tune places the trials (:func:`~mlrc.search.backends.ray.run_search_ray`); a local
    Ray when ``options["address"]`` is None, else the cluster at that address."""

    name: str = "ray"

    def session(self, options: Mapping[str, Any], quiet: bool) -> AbstractContextManager[Any]:
        return _ray_session(options.get("address"), quiet)

    def search(self, ctx: StudySession, options: Mapping[str, Any]) -> None:
        _local_ray_only_listens_here(options.get("address"))
        from mlrc.search.backends import ray as backend  # noqa: PLC0415 — Ray is optional

        options = dict(options)
        scheduler = backend.scheduler_named(options.pop("scheduler", "none"), len(ctx.split.folds))
        backend.run_search_ray(ctx, scheduler=scheduler, **options)

    def uses_this_process(self, options: Mapping[str, Any]) -> bool:
        return options.get("address") is None  # a remote cluster's GPUs are not ours to see


BACKENDS: dict[str, Backend] = {b.name: b for b in (LocalBackend(), RayBackend())}


def backend_named(name: str) -> Backend:
    """The backend called ``name``; a :class:`StudyError` naming the choices otherwise."""
    if name not in BACKENDS:
        raise StudyError(
            f"unknown backend {name!r} ({' or '.join(BACKENDS)}; for a worker pool use "
            "`mlrc worker`)"
        )
    return BACKENDS[name]


def _local_ray_only_listens_here(address: str | None) -> None:
    """A local Ray listens on 127.0.0.1 only (set before ray is imported)."""
    if address is None:
        os.environ.setdefault("RAY_ENABLE_WINDOWS_OR_OSX_CLUSTER", "0")


@contextmanager
def _ray_session(address: str | None, quiet: bool) -> Iterator[None]:
    """One Ray session for several studies (a campaign's), not one per study; a session this
    process did not start (``ray.init`` done by the caller) is left running."""
    _local_ray_only_listens_here(address)
    import ray  # noqa: PLC0415 — Ray is optional

    started = False
    if not ray.is_initialized():
        ray.init(
            address=address,
            include_dashboard=False,
            log_to_driver=not quiet,
            logging_level=logging.WARNING,
        )
        started = True
    try:
        yield
    finally:
        if started:
            ray.shutdown()
