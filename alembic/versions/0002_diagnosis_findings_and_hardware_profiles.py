"""diagnosis findings and hardware profiles

Revision ID: 0002
Revises: 0001
Create Date: 2026-12-02 17:41:21.911980
"""
import sqlalchemy as sa

from alembic import op

revision = '0002'
down_revision = '0001'
branch_labels = None
depends_on = None


def upgrade() -> None:

    op.create_table('diagnoses',
    sa.Column('target_id', sa.Integer(), nullable=False),
    sa.Column('model', sa.String(length=256), nullable=False),
    sa.Column('verdict', sa.String(length=32), nullable=False),
    sa.Column('evaluated_at', sa.Float(), nullable=False),
    sa.Column('details', sa.JSON(), nullable=False),
    sa.ForeignKeyConstraint(['target_id'], ['targets.id'], ondelete='CASCADE'),
    sa.PrimaryKeyConstraint('target_id', 'model')
    )
    op.create_table('findings',
    sa.Column('id', sa.Integer(), nullable=False),
    sa.Column('target_id', sa.Integer(), nullable=False),
    sa.Column('model', sa.String(length=256), nullable=False),
    sa.Column('regime', sa.String(length=32), nullable=False),
    sa.Column('state', sa.String(length=12), nullable=False),
    sa.Column('severity', sa.String(length=12), nullable=False),
    sa.Column('confidence', sa.Float(), nullable=False),
    sa.Column('is_primary', sa.Boolean(), nullable=False),
    sa.Column('summary', sa.Text(), nullable=False),
    sa.Column('details', sa.JSON(), nullable=False),
    sa.Column('first_seen', sa.Float(), nullable=False),
    sa.Column('last_seen', sa.Float(), nullable=False),
    sa.Column('activated_at', sa.Float(), nullable=True),
    sa.Column('resolved_at', sa.Float(), nullable=True),
    sa.Column('consecutive', sa.Integer(), nullable=False),
    sa.Column('clear_count', sa.Integer(), nullable=False),
    sa.ForeignKeyConstraint(['target_id'], ['targets.id'], ondelete='CASCADE'),
    sa.PrimaryKeyConstraint('id')
    )
    with op.batch_alter_table('findings', schema=None) as batch_op:
        batch_op.create_index('ix_findings_last_seen', ['last_seen'], unique=False)
        batch_op.create_index('ix_findings_open', ['target_id', 'model', 'state'], unique=False)

    with op.batch_alter_table('targets', schema=None) as batch_op:
        batch_op.add_column(sa.Column('hardware', sa.JSON(), nullable=True))




def downgrade() -> None:

    with op.batch_alter_table('targets', schema=None) as batch_op:
        batch_op.drop_column('hardware')

    with op.batch_alter_table('findings', schema=None) as batch_op:
        batch_op.drop_index('ix_findings_open')
        batch_op.drop_index('ix_findings_last_seen')

    op.drop_table('findings')
    op.drop_table('diagnoses')

