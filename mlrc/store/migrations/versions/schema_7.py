"""Schema 7: what computed a fold run (mlrc_fold_run.provenance: the device's name, torch,
CUDA, cuDNN and driver versions, the TF32 and deterministic settings).

Revision ID: schema_7
Revises: schema_6
"""

import sqlalchemy as sa
from alembic import op

revision = "schema_7"
down_revision = "schema_6"
branch_labels = None
depends_on = None
additive = True  # a new nullable column: schema-6 code ignores it


def upgrade() -> None:
    """Add the column unless a later build already made it."""
    have = {c["name"] for c in sa.inspect(op.get_bind()).get_columns("mlrc_fold_run")}
    if "provenance" not in have:
        op.add_column("mlrc_fold_run", sa.Column("provenance", sa.JSON(), nullable=True))


def downgrade() -> None:
    """Not supported: an older mlrc reads a copy of the database made before the upgrade."""
    raise NotImplementedError("mlrc's migrations go forward only")
