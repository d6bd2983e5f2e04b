"""Schema 5: the retrieval views (sample retrievals and embedding map of a tested reproduction).

Revision ID: schema_5
Revises: schema_4
"""

import sqlalchemy as sa
from alembic import op

revision = "schema_5"
down_revision = "schema_4"
branch_labels = None
depends_on = None
additive = True  # a new table: schema-4 code ignores it


def upgrade() -> None:
    """Add the table unless a later build already made it (``create_all`` on first use)."""
    if not sa.inspect(op.get_bind()).has_table("mlrc_retrieval_view"):
        op.create_table(
            "mlrc_retrieval_view",
            sa.Column("id", sa.Integer(), primary_key=True),
            sa.Column("study_id", sa.Integer(), sa.ForeignKey("mlrc_study.id"), nullable=False),
            sa.Column("reproduction", sa.Integer(), nullable=False),
            sa.Column("data", sa.JSON(), nullable=False),
            sa.Column("created", sa.DateTime(), nullable=False),
            sa.UniqueConstraint("study_id", "reproduction"),
        )


def downgrade() -> None:
    """Not supported: an older mlrc reads a copy of the database made before the upgrade."""
    raise NotImplementedError("mlrc's migrations go forward only")
