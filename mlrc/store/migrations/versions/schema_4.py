"""Schema 4: the study history (budget and retention changes) and fold_run.threads.

Revision ID: schema_4
Revises: schema_3
"""

import sqlalchemy as sa
from alembic import op

revision = "schema_4"
down_revision = "schema_3"
branch_labels = None
depends_on = None
additive = True  # a new nullable column and a new table: schema-3 code ignores them


def upgrade() -> None:
    """Add what is missing (a schema-3 store may have gained the table from a later build)."""
    inspector = sa.inspect(op.get_bind())
    have = {column["name"] for column in inspector.get_columns("mlrc_fold_run")}
    if "threads" not in have:
        op.add_column("mlrc_fold_run", sa.Column("threads", sa.Integer(), nullable=True))
    if not inspector.has_table("mlrc_study_history"):
        op.create_table(
            "mlrc_study_history",
            sa.Column("id", sa.Integer(), primary_key=True),
            sa.Column("study_id", sa.Integer(), sa.ForeignKey("mlrc_study.id"), nullable=False),
            sa.Column("time", sa.DateTime(), nullable=False),
            sa.Column("field", sa.String(64), nullable=False),
            sa.Column("old", sa.String(256), nullable=True),
            sa.Column("new", sa.String(256), nullable=True),
            sa.Column("code_version", sa.String(64), nullable=True),
        )


def downgrade() -> None:
    """Not supported: an older mlrc reads a copy of the database made before the upgrade."""
    raise NotImplementedError("mlrc's migrations go forward only")
