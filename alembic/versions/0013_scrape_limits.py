"""scrape limits per target; a series' identity holds its bounds by digest

``targets`` gets ``sample_limit``, ``series_limit`` and ``stored_series_limit`` (NULL: the
service's defaults, app/core/limits.py). ``series`` gets ``bounds_key``, the digest of its
bounds (app/store/repository.py ``bounds_key``), computed here for every existing row, and
the identity constraint takes it in place of the bounds: an index entry of the bounds text
is refused by PostgreSQL's btree past a few hundred buckets (8 kB), so a histogram with more
could never be stored there. The downgrade puts the bounds back in the constraint.

Revision ID: 0013
Revises: 0012
Create Date: 2026-12-06 09:00:00.000000
"""
import sqlalchemy as sa

from alembic import op

revision = '0013'
down_revision = '0012'
branch_labels = None
depends_on = None

_BATCH = 2000
_LIMITS = ('sample_limit', 'series_limit', 'stored_series_limit')


def upgrade() -> None:
    from app.store.repository import bounds_key

    with op.batch_alter_table('targets') as batch:
        for name in _LIMITS:
            batch.add_column(sa.Column(name, sa.Integer(), nullable=True))
    with op.batch_alter_table('series') as batch:
        batch.add_column(sa.Column('bounds_key', sa.String(length=32), nullable=False, server_default=''))
    bind = op.get_bind()
    series = sa.table('series', sa.column('id', sa.Integer()), sa.column('bounds', sa.Text()),
                      sa.column('bounds_key', sa.String()))
    rows = [{'row_id': sid, 'key': bounds_key(bounds)}
            for sid, bounds in bind.execute(sa.select(series.c.id, series.c.bounds).where(series.c.bounds != ''))]
    update = series.update().where(series.c.id == sa.bindparam('row_id')).values(bounds_key=sa.bindparam('key'))
    for i in range(0, len(rows), _BATCH):
        bind.execute(update, rows[i:i + _BATCH])
    with op.batch_alter_table('series') as batch:
        batch.drop_constraint('uq_series_identity', type_='unique')
        batch.create_unique_constraint('uq_series_identity', ['target_id', 'signal', 'model', 'rank', 'bounds_key'])


def downgrade() -> None:
    with op.batch_alter_table('series') as batch:
        batch.drop_constraint('uq_series_identity', type_='unique')
        batch.create_unique_constraint('uq_series_identity', ['target_id', 'signal', 'model', 'rank', 'bounds'])
        batch.drop_column('bounds_key')
    with op.batch_alter_table('targets') as batch:
        for name in reversed(_LIMITS):
            batch.drop_column(name)
