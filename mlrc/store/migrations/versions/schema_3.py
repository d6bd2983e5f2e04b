"""Schema 3: fold_run.objective and fold_run.code_version; the untrained-baseline tables.

Revision ID: schema_3
Revises: schema_2
"""

import sqlalchemy as sa
from alembic import op

revision = "schema_3"
down_revision = "schema_2"
branch_labels = None
depends_on = None
additive = True  # new nullable columns and new tables: schema-2 code ignores them


def upgrade() -> None:
    """Add what is missing (a schema-2 store may have gained the tables from a later build)."""
    inspector = sa.inspect(op.get_bind())
    have = {column["name"] for column in inspector.get_columns("mlrc_fold_run")}
    if "objective" not in have:
        op.add_column("mlrc_fold_run", sa.Column("objective", sa.Float(), nullable=True))
    if "code_version" not in have:
        op.add_column("mlrc_fold_run", sa.Column("code_version", sa.String(64), nullable=True))
    if not inspector.has_table("mlrc_baseline"):
        _create_baseline()
    if not inspector.has_table("mlrc_study_baseline"):
        op.create_table(
            "mlrc_study_baseline",
            sa.Column("id", sa.Integer(), primary_key=True),
            sa.Column(
                "study_id",
                sa.Integer(),
                sa.ForeignKey("mlrc_study.id"),
                nullable=False,
                unique=True,
            ),
            sa.Column("key", sa.String(64), nullable=False),
        )


def _create_baseline() -> None:
    op.create_table(
        "mlrc_baseline",
        sa.Column("id", sa.Integer(), primary_key=True),
        sa.Column("key", sa.String(64), nullable=False),
        sa.Column("dataset", sa.String(64), nullable=False),
        sa.Column("kind", sa.String(16), nullable=False),
        sa.Column("label", sa.String(128), nullable=False),
        sa.Column("trunk", sa.String(128), nullable=False),
        sa.Column("mode", sa.String(16), nullable=False),
        sa.Column("map_at_r", sa.Float(), nullable=False),
        sa.Column("precision_at_1", sa.Float(), nullable=False),
        sa.Column("r_precision", sa.Float(), nullable=False),
        sa.Column("extra", sa.JSON(), nullable=True),
        sa.Column("config", sa.JSON(), nullable=False),
        sa.Column("device", sa.String(32), nullable=True),
        sa.Column("code_version", sa.String(64), nullable=True),
        sa.Column("created", sa.DateTime(), nullable=False),
        sa.UniqueConstraint("key", "mode"),
    )


def downgrade() -> None:
    """Not supported: an older mlrc reads a copy of the database made before the upgrade."""
    raise NotImplementedError("mlrc's migrations go forward only")
