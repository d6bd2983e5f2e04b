"""Schema 2: mlrc's tables as the last release before schema 3 created them.

Revision ID: schema_2
Revises: (none)
"""

import sqlalchemy as sa
from alembic import op

revision = "schema_2"
down_revision = None
branch_labels = None
depends_on = None
additive = True  # creates tables only


def upgrade() -> None:
    """Create the schema-2 tables (a legacy schema-2 store is stamped here, not run)."""
    _create_study_tables()
    _create_trial_tables()
    _create_test_tables()


def _create_study_tables() -> None:
    """mlrc_meta, mlrc_study, mlrc_campaign_study (+ its index)."""
    op.create_table(
        "mlrc_meta",
        sa.Column("key", sa.String(64), primary_key=True),
        sa.Column("value", sa.String(256), nullable=False),
    )
    op.create_table(
        "mlrc_study",
        sa.Column("id", sa.Integer(), primary_key=True),
        sa.Column("name", sa.String(256), nullable=False, unique=True),
        sa.Column("dataset", sa.String(64), nullable=False),
        sa.Column("loss", sa.String(64), nullable=False),
        sa.Column("strategy", sa.String(64), nullable=True),
        sa.Column("preset", sa.String(256), nullable=False),
        sa.Column("config", sa.JSON(), nullable=False),
        sa.Column("code_version", sa.String(64), nullable=False),
        sa.Column("created", sa.DateTime(), nullable=False),
    )
    op.create_table(
        "mlrc_campaign_study",
        sa.Column("id", sa.Integer(), primary_key=True),
        sa.Column("campaign", sa.String(256), nullable=False),
        sa.Column("study_id", sa.Integer(), sa.ForeignKey("mlrc_study.id"), nullable=False),
        sa.Column("position", sa.Integer(), nullable=False),
        sa.Column("campaign_config", sa.JSON(), nullable=False),
        sa.UniqueConstraint("campaign", "study_id"),
    )
    op.create_index("ix_mlrc_campaign_study_campaign", "mlrc_campaign_study", ["campaign"])


def _create_trial_tables() -> None:
    """mlrc_trial, mlrc_fold_run (without objective, code_version), mlrc_epoch_metric."""
    op.create_table(
        "mlrc_trial",
        sa.Column("id", sa.Integer(), primary_key=True),
        sa.Column("study_id", sa.Integer(), sa.ForeignKey("mlrc_study.id"), nullable=False),
        sa.Column("number", sa.Integer(), nullable=False),
        sa.Column("params", sa.JSON(), nullable=False),
        sa.Column("params_hash", sa.String(64), nullable=False),
        sa.Column("state", sa.String(16), nullable=False),
        sa.Column("value", sa.Float(), nullable=True),
        sa.Column("sem", sa.Float(), nullable=True),
        sa.Column("reason", sa.Text(), nullable=True),
        sa.Column("updated", sa.DateTime(), nullable=False),
        sa.UniqueConstraint("study_id", "number"),
    )
    op.create_table(
        "mlrc_fold_run",
        sa.Column("id", sa.Integer(), primary_key=True),
        sa.Column("study_id", sa.Integer(), sa.ForeignKey("mlrc_study.id"), nullable=False),
        sa.Column("kind", sa.String(8), nullable=False),
        sa.Column("params_hash", sa.String(64), nullable=False),
        sa.Column("reproduction", sa.Integer(), nullable=False),
        sa.Column("fold", sa.Integer(), nullable=False),
        sa.Column("trial_number", sa.Integer(), nullable=True),
        sa.Column("seed", sa.Integer(), nullable=False),
        sa.Column("status", sa.String(16), nullable=False),
        sa.Column("reason", sa.Text(), nullable=True),
        sa.Column("best_epoch", sa.Integer(), nullable=True),
        sa.Column("map_at_r", sa.Float(), nullable=True),
        sa.Column("precision_at_1", sa.Float(), nullable=True),
        sa.Column("r_precision", sa.Float(), nullable=True),
        sa.Column("checkpoint", sa.Text(), nullable=True),
        sa.Column("wall_time_s", sa.Float(), nullable=True),
        sa.Column("device", sa.String(32), nullable=True),
        sa.Column("updated", sa.DateTime(), nullable=False),
        sa.UniqueConstraint("study_id", "kind", "params_hash", "reproduction", "fold"),
    )
    op.create_table(
        "mlrc_epoch_metric",
        sa.Column("id", sa.Integer(), primary_key=True),
        sa.Column("fold_run_id", sa.Integer(), sa.ForeignKey("mlrc_fold_run.id"), nullable=False),
        sa.Column("epoch", sa.Integer(), nullable=False),
        sa.Column("train_loss", sa.Float(), nullable=True),
        sa.Column("map_at_r", sa.Float(), nullable=False),
        sa.Column("precision_at_1", sa.Float(), nullable=False),
        sa.Column("r_precision", sa.Float(), nullable=False),
        sa.UniqueConstraint("fold_run_id", "epoch"),
    )


def _create_test_tables() -> None:
    """mlrc_test_result (with extra: the analysis metrics, new in schema 2)."""
    op.create_table(
        "mlrc_test_result",
        sa.Column("id", sa.Integer(), primary_key=True),
        sa.Column("study_id", sa.Integer(), sa.ForeignKey("mlrc_study.id"), nullable=False),
        sa.Column("reproduction", sa.Integer(), nullable=False),
        sa.Column("mode", sa.String(16), nullable=False),
        sa.Column("fold", sa.Integer(), nullable=False),
        sa.Column("map_at_r", sa.Float(), nullable=False),
        sa.Column("precision_at_1", sa.Float(), nullable=False),
        sa.Column("r_precision", sa.Float(), nullable=False),
        sa.Column("params", sa.JSON(), nullable=False),
        sa.Column("extra", sa.JSON(), nullable=True),
        sa.UniqueConstraint("study_id", "reproduction", "mode", "fold"),
    )


def downgrade() -> None:
    """Not supported: an older mlrc reads a copy of the database made before the upgrade."""
    raise NotImplementedError("mlrc's migrations go forward only")
