"""mlrc's Alembic migrations (``env.py`` and ``versions/``), run by :mod:`mlrc.store.migrate`.

Their version table is ``mlrc_alembic_version``: Optuna keeps its own ``alembic_version`` table
in the same database, which mlrc never touches. A new revision is a module in ``versions/``
(revision id ``schema_N`` for schema version N; ``additive = True`` when it only adds tables or
nullable columns, so that opening a store may run it); see docs/guide/store.md.
"""
