"""initial schema

Revision ID: 0001
Revises:
Create Date: 2026-12-02 17:05:14.299416
"""
import sqlalchemy as sa

from alembic import op

revision = '0001'
down_revision = None
branch_labels = None
depends_on = None


def upgrade() -> None:

    op.create_table('targets',
    sa.Column('id', sa.Integer(), nullable=False),
    sa.Column('name', sa.String(length=64), nullable=False),
    sa.Column('url', sa.Text(), nullable=False),
    sa.Column('engine', sa.String(length=16), nullable=False),
    sa.Column('detected_engine', sa.String(length=16), nullable=True),
    sa.Column('labels', sa.JSON(), nullable=False),
    sa.Column('scrape_interval', sa.Float(), nullable=True),
    sa.Column('scrape_timeout', sa.Float(), nullable=True),
    sa.Column('source', sa.String(length=8), nullable=False),
    sa.Column('created_at', sa.Float(), nullable=False),
    sa.Column('updated_at', sa.Float(), nullable=False),
    sa.PrimaryKeyConstraint('id'),
    sa.UniqueConstraint('name')
    )
    op.create_table('scrapes',
    sa.Column('id', sa.Integer(), nullable=False),
    sa.Column('target_id', sa.Integer(), nullable=False),
    sa.Column('ts', sa.Float(), nullable=False),
    sa.Column('up', sa.Boolean(), nullable=False),
    sa.Column('duration', sa.Float(), nullable=False),
    sa.Column('bytes', sa.Integer(), nullable=False),
    sa.Column('samples_seen', sa.Integer(), nullable=False),
    sa.Column('samples_kept', sa.Integer(), nullable=False),
    sa.Column('malformed', sa.Integer(), nullable=False),
    sa.Column('engine', sa.String(length=16), nullable=True),
    sa.Column('error_class', sa.String(length=32), nullable=True),
    sa.Column('error', sa.Text(), nullable=True),
    sa.ForeignKeyConstraint(['target_id'], ['targets.id'], ondelete='CASCADE'),
    sa.PrimaryKeyConstraint('id')
    )
    with op.batch_alter_table('scrapes', schema=None) as batch_op:
        batch_op.create_index('ix_scrapes_target_ts', ['target_id', 'ts'], unique=False)
        batch_op.create_index('ix_scrapes_ts', ['ts'], unique=False)

    op.create_table('series',
    sa.Column('id', sa.Integer(), nullable=False),
    sa.Column('target_id', sa.Integer(), nullable=False),
    sa.Column('signal', sa.String(length=32), nullable=False),
    sa.Column('kind', sa.String(length=12), nullable=False),
    sa.Column('model', sa.String(length=256), nullable=False),
    sa.Column('rank', sa.String(length=16), nullable=False),
    sa.Column('bounds', sa.Text(), nullable=False),
    sa.ForeignKeyConstraint(['target_id'], ['targets.id'], ondelete='CASCADE'),
    sa.PrimaryKeyConstraint('id'),
    sa.UniqueConstraint('target_id', 'signal', 'model', 'rank', 'bounds', name='uq_series_identity')
    )
    op.create_table('target_info',
    sa.Column('target_id', sa.Integer(), nullable=False),
    sa.Column('name', sa.String(length=64), nullable=False),
    sa.Column('model', sa.String(length=256), nullable=False),
    sa.Column('rank', sa.String(length=16), nullable=False),
    sa.Column('labels', sa.JSON(), nullable=False),
    sa.Column('ts', sa.Float(), nullable=False),
    sa.ForeignKeyConstraint(['target_id'], ['targets.id'], ondelete='CASCADE'),
    sa.PrimaryKeyConstraint('target_id', 'name', 'model', 'rank')
    )
    op.create_table('histogram_samples',
    sa.Column('series_id', sa.Integer(), nullable=False),
    sa.Column('ts', sa.Float(), nullable=False),
    sa.Column('counts', sa.Text(), nullable=False),
    sa.Column('sum', sa.Float(), nullable=True),
    sa.Column('count', sa.Float(), nullable=False),
    sa.ForeignKeyConstraint(['series_id'], ['series.id'], ondelete='CASCADE'),
    sa.PrimaryKeyConstraint('series_id', 'ts')
    )
    op.create_table('scalar_samples',
    sa.Column('series_id', sa.Integer(), nullable=False),
    sa.Column('ts', sa.Float(), nullable=False),
    sa.Column('value', sa.Float(), nullable=False),
    sa.ForeignKeyConstraint(['series_id'], ['series.id'], ondelete='CASCADE'),
    sa.PrimaryKeyConstraint('series_id', 'ts')
    )



def downgrade() -> None:

    op.drop_table('scalar_samples')
    op.drop_table('histogram_samples')
    op.drop_table('target_info')
    op.drop_table('series')
    with op.batch_alter_table('scrapes', schema=None) as batch_op:
        batch_op.drop_index('ix_scrapes_ts')
        batch_op.drop_index('ix_scrapes_target_ts')

    op.drop_table('scrapes')
    op.drop_table('targets')

