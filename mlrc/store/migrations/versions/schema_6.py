"""Schema 6: a study's settings (mlrc_study.settings: its torch threads, retention and the values
its file last gave).

Revision ID: schema_6
Revises: schema_5
"""

import sqlalchemy as sa
from alembic import op

revision = "schema_6"
down_revision = "schema_5"
branch_labels = None
depends_on = None
additive = True  # a new nullable column: schema-5 code ignores it


def upgrade() -> None:
    """Add the column unless a later build already made it."""
    have = {c["name"] for c in sa.inspect(op.get_bind()).get_columns("mlrc_study")}
    if "settings" not in have:
        op.add_column("mlrc_study", sa.Column("settings", sa.JSON(), nullable=True))


def downgrade() -> None:
    """Not supported: an older mlrc reads a copy of the database made before the upgrade."""
    raise NotImplementedError("mlrc's migrations go forward only")
