"""probe runs and probe requests (client-side TTFT/ITL probes, canaries, sweeps)

Revision ID: 0004
Revises: 0003
Create Date: 2026-12-09 10:00:00.000000
"""
import sqlalchemy as sa

from alembic import op

revision = '0004'
down_revision = '0003'
branch_labels = None
depends_on = None


def upgrade() -> None:
    with op.batch_alter_table('targets', schema=None) as batch_op:
        batch_op.add_column(sa.Column('canary', sa.JSON(), nullable=True))
    op.create_table('probe_runs',
    sa.Column('id', sa.Integer(), nullable=False),
    sa.Column('target_id', sa.Integer(), nullable=True),
    sa.Column('target', sa.String(length=256), nullable=False),
    sa.Column('url', sa.Text(), nullable=False),
    sa.Column('kind', sa.String(length=8), nullable=False),
    sa.Column('params', sa.JSON(), nullable=False),
    sa.Column('state', sa.String(length=10), nullable=False),
    sa.Column('started_at', sa.Float(), nullable=False),
    sa.Column('finished_at', sa.Float(), nullable=True),
    sa.Column('summary', sa.JSON(), nullable=True),
    sa.Column('error', sa.Text(), nullable=True),
    sa.ForeignKeyConstraint(['target_id'], ['targets.id'], ondelete='SET NULL'),
    sa.PrimaryKeyConstraint('id')
    )
    with op.batch_alter_table('probe_runs', schema=None) as batch_op:
        batch_op.create_index('ix_probe_runs_target', ['target', 'kind', 'started_at'], unique=False)
        batch_op.create_index('ix_probe_runs_target_id', ['target_id', 'kind', 'started_at'], unique=False)

    op.create_table('probe_requests',
    sa.Column('id', sa.Integer(), nullable=False),
    sa.Column('run_id', sa.Integer(), nullable=False),
    sa.Column('level', sa.Integer(), nullable=False),
    sa.Column('concurrency', sa.Integer(), nullable=False),
    sa.Column('prompt_tokens', sa.Integer(), nullable=False),
    sa.Column('max_tokens', sa.Integer(), nullable=False),
    sa.Column('seq', sa.Integer(), nullable=False),
    sa.Column('started_at', sa.Float(), nullable=False),
    sa.Column('ttft', sa.Float(), nullable=True),
    sa.Column('e2e', sa.Float(), nullable=True),
    sa.Column('itl_mean', sa.Float(), nullable=True),
    sa.Column('itl_p50', sa.Float(), nullable=True),
    sa.Column('itl_p99', sa.Float(), nullable=True),
    sa.Column('itl_max', sa.Float(), nullable=True),
    sa.Column('tokens', sa.Integer(), nullable=False),
    sa.Column('prompt_tokens_seen', sa.Integer(), nullable=True),
    sa.Column('completion_tokens', sa.Integer(), nullable=True),
    sa.Column('finish_reason', sa.String(length=32), nullable=True),
    sa.Column('status_code', sa.Integer(), nullable=True),
    sa.Column('error', sa.String(length=16), nullable=True),
    sa.Column('detail', sa.Text(), nullable=True),
    sa.ForeignKeyConstraint(['run_id'], ['probe_runs.id'], ondelete='CASCADE'),
    sa.PrimaryKeyConstraint('id')
    )
    with op.batch_alter_table('probe_requests', schema=None) as batch_op:
        batch_op.create_index('ix_probe_requests_run', ['run_id', 'level', 'seq'], unique=False)


def downgrade() -> None:
    with op.batch_alter_table('targets', schema=None) as batch_op:
        batch_op.drop_column('canary')
    with op.batch_alter_table('probe_requests', schema=None) as batch_op:
        batch_op.drop_index('ix_probe_requests_run')

    op.drop_table('probe_requests')
    with op.batch_alter_table('probe_runs', schema=None) as batch_op:
        batch_op.drop_index('ix_probe_runs_target_id')
        batch_op.drop_index('ix_probe_runs_target')

    op.drop_table('probe_runs')
