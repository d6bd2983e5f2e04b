"""Where a study's trials run: :mod:`~mlrc.search.backends.local` (one process, or a pool of
``mlrc worker`` processes sharing a PostgreSQL store) and :mod:`~mlrc.search.backends.ray`
(Ray Tune places the trials; imported on demand, Ray is optional)."""

from mlrc.search.backends.local import run_search

__all__ = ["run_search"]
