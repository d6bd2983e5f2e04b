"""Schema 8: the stored test embeddings of each tested reproduction (mlrc_embedding_file: path
and sha256) and the metrics re-scored from them after the fact (mlrc_rescored).

Revision ID: schema_8
Revises: schema_7
"""

import sqlalchemy as sa
from alembic import op

revision = "schema_8"
down_revision = "schema_7"
branch_labels = None
depends_on = None
additive = True  # new tables: schema-7 code ignores them


def upgrade() -> None:
    """Add the tables unless a later build already made them (``create_all`` on first use)."""
    have = sa.inspect(op.get_bind())
    if not have.has_table("mlrc_embedding_file"):
        op.create_table(
            "mlrc_embedding_file",
            sa.Column("id", sa.Integer(), primary_key=True),
            sa.Column("study_id", sa.Integer(), sa.ForeignKey("mlrc_study.id"), nullable=False),
            sa.Column("reproduction", sa.Integer(), nullable=False),
            sa.Column("params_hash", sa.String(64), nullable=False),
            sa.Column("path", sa.Text(), nullable=False),
            sa.Column("sha256", sa.String(64), nullable=False),
            sa.Column("dtype", sa.String(16), nullable=False),
            sa.Column("folds", sa.Integer(), nullable=False),
            sa.Column("n", sa.Integer(), nullable=False),
            sa.Column("dim", sa.Integer(), nullable=False),
            sa.Column("size", sa.Integer(), nullable=False),
            sa.Column("retrieval", sa.String(16), nullable=False),
            sa.Column("created", sa.DateTime(), nullable=False),
            sa.UniqueConstraint("study_id", "reproduction"),
        )
    if not have.has_table("mlrc_rescored"):
        op.create_table(
            "mlrc_rescored",
            sa.Column("id", sa.Integer(), primary_key=True),
            sa.Column("study_id", sa.Integer(), sa.ForeignKey("mlrc_study.id"), nullable=False),
            sa.Column("reproduction", sa.Integer(), nullable=False),
            sa.Column("mode", sa.String(16), nullable=False),
            sa.Column("fold", sa.Integer(), nullable=False),
            sa.Column("metric", sa.String(64), nullable=False),
            sa.Column("value", sa.Float(), nullable=False),
            sa.Column("sha256", sa.String(64), nullable=False),
            sa.Column("code_version", sa.String(64), nullable=True),
            sa.Column("created", sa.DateTime(), nullable=False),
            sa.UniqueConstraint("study_id", "reproduction", "mode", "fold", "metric"),
        )


def downgrade() -> None:
    """Not supported: an older mlrc reads a copy of the database made before the upgrade."""
    raise NotImplementedError("mlrc's migrations go forward only")
