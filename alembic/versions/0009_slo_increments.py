"""SLO increments: the recording table of the latency SLOs

Per SLO, target and alerting round, the good and total requests between consecutive stored
histogram snapshots (app/slo/record.py), so burn rates over 5 m .. 28 d are sums of few rows.

Revision ID: 0009
Revises: 0006
Create Date: 2026-12-03 18:00:00.000000
"""
import sqlalchemy as sa

from alembic import op

revision = '0009'
down_revision = '0006'
branch_labels = None
depends_on = None


def upgrade() -> None:
    op.create_table(
        'slo_increments',
        sa.Column('slo', sa.String(length=64), nullable=False),
        sa.Column('target_id', sa.Integer(), nullable=False),
        sa.Column('ts_end', sa.Float(), nullable=False),
        sa.Column('signal', sa.String(length=32), nullable=False),
        sa.Column('threshold', sa.Float(), nullable=False),
        sa.Column('ts_start', sa.Float(), nullable=False),
        sa.Column('good', sa.Float(), nullable=False),
        sa.Column('total', sa.Float(), nullable=False),
        sa.ForeignKeyConstraint(['target_id'], ['targets.id'], ondelete='CASCADE'),
        sa.PrimaryKeyConstraint('slo', 'target_id', 'ts_end'),
    )
    op.create_index('ix_slo_increments_window', 'slo_increments', ['slo', 'signal', 'threshold', 'ts_end'],
                    unique=False)


def downgrade() -> None:
    op.drop_index('ix_slo_increments_window', table_name='slo_increments')
    op.drop_table('slo_increments')
