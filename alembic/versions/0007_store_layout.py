"""store layout: binary bucket counts, downsampled levels, day partitions on PostgreSQL

``histogram_samples.counts`` changes from comma-joined text to the binary encoding of
app/store/encoding.py (existing rows converted). ``sample_levels`` holds the 5-minute and
1-hour levels (app/store/levels.py); ``level_progress`` says how far they are built (migration
0012 builds them, from the raw rows as it lays them out). On PostgreSQL the three sample tables
become ``PARTITION BY RANGE`` tables with one partition per day (app/store/partitions.py),
the existing rows copied into them. The downgrade converts the counts back to text and
drops the levels (raw samples pruned since are not restored).

Revision ID: 0007
Revises: 0006
Create Date: 2026-12-03 18:00:00.000000
"""
import time

import sqlalchemy as sa

from alembic import op

revision = '0007'
down_revision = '0006'
branch_labels = None
depends_on = None

_BATCH = 5000


def _histogram_columns(counts_type: sa.types.TypeEngine) -> list[sa.Column]:
    return [sa.Column('series_id', sa.Integer(), sa.ForeignKey('series.id', ondelete='CASCADE'), nullable=False),
            sa.Column('ts', sa.Float(), nullable=False),
            sa.Column('counts', counts_type, nullable=False),
            sa.Column('sum', sa.Float(), nullable=True),
            sa.Column('count', sa.Float(), nullable=False),
            sa.PrimaryKeyConstraint('series_id', 'ts')]


def _scalar_columns() -> list[sa.Column]:
    return [sa.Column('series_id', sa.Integer(), sa.ForeignKey('series.id', ondelete='CASCADE'), nullable=False),
            sa.Column('ts', sa.Float(), nullable=False),
            sa.Column('value', sa.Float(), nullable=False),
            sa.PrimaryKeyConstraint('series_id', 'ts')]


def _level_columns() -> list[sa.Column]:
    return [sa.Column('series_id', sa.Integer(), sa.ForeignKey('series.id', ondelete='CASCADE'), nullable=False),
            sa.Column('level', sa.Integer(), nullable=False),
            sa.Column('bucket', sa.Float(), nullable=False),
            sa.Column('n', sa.Integer(), nullable=False),
            sa.Column('first_ts', sa.Float(), nullable=False),
            sa.Column('first', sa.LargeBinary(), nullable=False),
            sa.Column('last_ts', sa.Float(), nullable=False),
            sa.Column('last', sa.LargeBinary(), nullable=False),
            sa.Column('resets', sa.LargeBinary(), nullable=True),
            sa.Column('total', sa.Float(), nullable=True),
            sa.Column('peak', sa.Float(), nullable=True),
            sa.PrimaryKeyConstraint('series_id', 'level', 'bucket')]


def _copy_histograms(bind: sa.engine.Connection, source: str, target: str, convert) -> None:
    """Copy rows in batches, converting ``counts`` in Python (both encodings are ours)."""
    rows = bind.execute(sa.text(f'SELECT series_id, ts, counts, sum, count FROM {source}')
                        .execution_options(stream_results=True, yield_per=_BATCH))
    insert = sa.text(f'INSERT INTO {target} (series_id, ts, counts, sum, count) '
                     'VALUES (:series_id, :ts, :counts, :sum, :count)').bindparams(
        sa.bindparam('counts', type_=sa.LargeBinary() if convert is to_binary else sa.Text()))
    for part in rows.partitions(_BATCH):
        bind.execute(insert, [{'series_id': r[0], 'ts': r[1], 'counts': convert(r[2]), 'sum': r[3], 'count': r[4]}
                              for r in part])


def to_binary(text: str):
    from app.store.encoding import encode_counts

    return encode_counts(tuple(map(float, text.split(','))) if text else ())


def to_text(blob: bytes) -> str:
    from app.store.encoding import decode_counts

    return ','.join(repr(float(v)) for v in decode_counts(bytes(blob)))


def _time_range(bind: sa.engine.Connection) -> tuple[float, float]:
    now = time.time()
    low = [v for v in (bind.scalar(sa.text('SELECT min(ts) FROM histogram_samples_old')),
                       bind.scalar(sa.text('SELECT min(ts) FROM scalar_samples_old'))) if v is not None]
    return (min(low) if low else now), now


def upgrade() -> None:
    from app.store import partitions

    bind = op.get_bind()
    postgres = bind.dialect.name == 'postgresql'
    op.rename_table('histogram_samples', 'histogram_samples_old')
    if postgres:
        op.execute('ALTER TABLE histogram_samples_old RENAME CONSTRAINT histogram_samples_pkey '
                   'TO histogram_samples_old_pkey')
        op.rename_table('scalar_samples', 'scalar_samples_old')
        op.execute('ALTER TABLE scalar_samples_old RENAME CONSTRAINT scalar_samples_pkey TO scalar_samples_old_pkey')
        by_ts = {'postgresql_partition_by': 'RANGE (ts)'}
        op.create_table('histogram_samples', *_histogram_columns(sa.LargeBinary()), **by_ts)
        op.create_table('scalar_samples', *_scalar_columns(), **by_ts)
        op.create_table('sample_levels', *_level_columns(), postgresql_partition_by='RANGE (bucket)')
        start, now = _time_range(bind)
        for table in ('histogram_samples', 'scalar_samples', 'sample_levels'):
            partitions.ensure(bind, table, start, now + partitions.layout_of(table).ahead)
        op.execute('INSERT INTO scalar_samples (series_id, ts, value) SELECT series_id, ts, value '
                   'FROM scalar_samples_old')
        op.drop_table('scalar_samples_old')
    else:
        op.create_table('histogram_samples', *_histogram_columns(sa.LargeBinary()))
        op.create_table('sample_levels', *_level_columns())
    _copy_histograms(bind, 'histogram_samples_old', 'histogram_samples', to_binary)
    op.drop_table('histogram_samples_old')
    op.create_table('level_progress', sa.Column('level', sa.Integer(), primary_key=True),
                    sa.Column('done_until', sa.Float(), nullable=False))
    # the levels are built by 0012 (the store's code reads the raw samples as 0012 lays them out)


def downgrade() -> None:
    bind = op.get_bind()
    postgres = bind.dialect.name == 'postgresql'
    op.drop_table('level_progress')
    op.drop_table('sample_levels')
    op.rename_table('histogram_samples', 'histogram_samples_old')
    if postgres:
        op.rename_table('scalar_samples', 'scalar_samples_old')
        op.execute('ALTER TABLE histogram_samples_old RENAME CONSTRAINT histogram_samples_pkey '
                   'TO histogram_samples_old_pkey')
        op.execute('ALTER TABLE scalar_samples_old RENAME CONSTRAINT scalar_samples_pkey TO scalar_samples_old_pkey')
        op.create_table('scalar_samples', *_scalar_columns())
        op.execute('INSERT INTO scalar_samples (series_id, ts, value) SELECT series_id, ts, value '
                   'FROM scalar_samples_old')
        op.drop_table('scalar_samples_old')
    op.create_table('histogram_samples', *_histogram_columns(sa.Text()))
    _copy_histograms(bind, 'histogram_samples_old', 'histogram_samples', to_text)
    op.drop_table('histogram_samples_old')
