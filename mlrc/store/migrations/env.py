"""Alembic's entry point for mlrc's tables: run with the connection that
:mod:`mlrc.store.migrate` hands over (``config.attributes["connection"]``), or with an engine
for the ``sqlalchemy.url`` option. Optuna's tables are none of these migrations' business."""

from __future__ import annotations

from alembic import context
from sqlalchemy import create_engine

from mlrc.store.migrate import VERSION_TABLE
from mlrc.store.schema import Base


def _mlrc_table(name: str | None, type_: str, _: object) -> bool:
    """Autogenerate compares mlrc's tables only (``alembic revision --autogenerate``)."""
    return type_ != "table" or (name or "").startswith("mlrc_")


def run(connection: object) -> None:
    """Run the requested command (upgrade, stamp) on ``connection``."""
    context.configure(
        connection=connection,
        target_metadata=Base.metadata,
        version_table=VERSION_TABLE,
        include_name=_mlrc_table,
        render_as_batch=True,  # SQLite: column changes by table copy
    )
    with context.begin_transaction():
        context.run_migrations()


connection = context.config.attributes.get("connection")
if connection is not None:
    run(connection)
else:
    engine = create_engine(context.config.get_main_option("sqlalchemy.url"))
    with engine.begin() as conn:
        run(conn)
    engine.dispose()
