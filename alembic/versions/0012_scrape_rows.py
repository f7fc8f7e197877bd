"""raw samples: one row per scrape

``histogram_samples`` (a row per histogram series and scrape) and ``scalar_samples`` (a row
per gauge or counter series and scrape) become ``scrape_samples``: one row per target and
scrape holding every series' sample (app/store/encoding.py ``encode_scrape``). A
vLLM page's 20 rows cost PostgreSQL a tuple header, alignment and a primary-key entry
each, more than the samples (docs/operations.md#encoding). Existing rows are converted,
target by target; on PostgreSQL the new table is partitioned by hour like the old ones. The
levels are built (or completed) from the converted rows. The downgrade converts back.

Revision ID: 0012
Revises: 0011
Create Date: 2026-12-05 07:00:00.000000
"""
import contextlib
import math
import time
from collections import defaultdict

import sqlalchemy as sa

from alembic import op

revision = '0012'
down_revision = '0011'
branch_labels = None
depends_on = None

_BATCH = 2000


def _scrape_columns() -> list[sa.Column]:
    return [sa.Column('target_id', sa.Integer(), sa.ForeignKey('targets.id', ondelete='CASCADE'), nullable=False),
            sa.Column('ts', sa.Float(), nullable=False),
            sa.Column('samples', sa.LargeBinary(), nullable=False),
            sa.PrimaryKeyConstraint('target_id', 'ts')]


def _histogram_columns() -> list[sa.Column]:
    return [sa.Column('series_id', sa.Integer(), sa.ForeignKey('series.id', ondelete='CASCADE'), nullable=False),
            sa.Column('ts', sa.Float(), nullable=False),
            sa.Column('counts', sa.LargeBinary(), nullable=False),
            sa.Column('sum', sa.Float(), nullable=True),
            sa.Column('count', sa.Float(), nullable=False),
            sa.PrimaryKeyConstraint('series_id', 'ts')]


def _scalar_columns() -> list[sa.Column]:
    return [sa.Column('series_id', sa.Integer(), sa.ForeignKey('series.id', ondelete='CASCADE'), nullable=False),
            sa.Column('ts', sa.Float(), nullable=False),
            sa.Column('value', sa.Float(), nullable=False),
            sa.PrimaryKeyConstraint('series_id', 'ts')]


def _make_partitioned(bind: sa.engine.Connection, tables: dict[str, list[sa.Column]], earliest: str) -> None:
    """Create ``tables``; on PostgreSQL partitioned by hour from the earliest sample of
    the ``earliest`` query to the partitions kept ahead."""
    from app.store import partitions

    postgres = bind.dialect.name == 'postgresql'
    for table, columns in tables.items():
        op.create_table(table, *columns, **({'postgresql_partition_by': 'RANGE (ts)'} if postgres else {}))
    if postgres:
        now = time.time()
        low = bind.scalar(sa.text(earliest))
        for table in tables:
            partitions.ensure(bind, table, now if low is None else min(low, now),
                              now + partitions.layout_of(table).ahead)


def _insert(bind: sa.engine.Connection, sql: str, rows: list[dict], blob: str | None = None) -> None:
    statement = sa.text(sql)
    if blob is not None:
        statement = statement.bindparams(sa.bindparam(blob, type_=sa.LargeBinary()))
    for i in range(0, len(rows), _BATCH):
        bind.execute(statement, rows[i:i + _BATCH])


def upgrade() -> None:
    from app.store import repository
    from app.store.encoding import encode_scrape, snapshot_blob

    bind = op.get_bind()
    _make_partitioned(bind, {'scrape_samples': _scrape_columns()},
                      'SELECT min(ts) FROM (SELECT min(ts) AS ts FROM histogram_samples '
                      'UNION ALL SELECT min(ts) FROM scalar_samples) AS m')
    series: dict[int, list[int]] = defaultdict(list)
    for sid, target_id in bind.execute(sa.text('SELECT id, target_id FROM series')):
        series[target_id].append(sid)
    for target_id, ids in sorted(series.items()):
        entries: dict[float, tuple[list, list]] = defaultdict(lambda: ([], []))
        params = sa.bindparam('ids', expanding=True)
        for sid, ts, counts, total, count in bind.execute(sa.text(
                'SELECT series_id, ts, counts, sum, count FROM histogram_samples WHERE series_id IN :ids')
                .bindparams(params), {'ids': ids}):
            entries[ts][0].append((sid, snapshot_blob(bytes(counts), math.nan if total is None else total, count)))
        for sid, ts, value in bind.execute(sa.text(
                'SELECT series_id, ts, value FROM scalar_samples WHERE series_id IN :ids').bindparams(params),
                {'ids': ids}):
            entries[ts][1].append((sid, value))
        _insert(bind, 'INSERT INTO scrape_samples (target_id, ts, samples) VALUES (:target_id, :ts, :samples)',
                [{'target_id': target_id, 'ts': ts, 'samples': encode_scrape(sorted(h), sorted(s))}
                 for ts, (h, s) in sorted(entries.items())], 'samples')
    op.drop_table('histogram_samples')
    op.drop_table('scalar_samples')
    repository.downsample(lambda: contextlib.nullcontext(bind), time.time())


def downgrade() -> None:
    from app.store.encoding import decode_scrape, encode_counts

    bind = op.get_bind()
    _make_partitioned(bind, {'histogram_samples': _histogram_columns(), 'scalar_samples': _scalar_columns()},
                      'SELECT min(ts) FROM scrape_samples')
    kinds = dict(bind.execute(sa.text('SELECT id, kind FROM series')).all())
    histograms: list[dict] = []
    scalars: list[dict] = []

    def flush(force: bool) -> None:
        if histograms and (force or len(histograms) >= _BATCH):
            _insert(bind, 'INSERT INTO histogram_samples (series_id, ts, counts, sum, count) '
                    'VALUES (:series_id, :ts, :counts, :sum, :count)', histograms, 'counts')
            histograms.clear()
        if scalars and (force or len(scalars) >= _BATCH):
            _insert(bind, 'INSERT INTO scalar_samples (series_id, ts, value) VALUES (:series_id, :ts, :value)',
                    scalars)
            scalars.clear()

    rows = bind.execute(sa.text('SELECT ts, samples FROM scrape_samples')
                        .execution_options(stream_results=True, yield_per=_BATCH))
    for ts, blob in rows:
        for sid, vector in decode_scrape(bytes(blob), kinds):
            if kinds[sid] == 'histogram':
                total = vector[-2]
                histograms.append({'series_id': sid, 'ts': ts, 'counts': encode_counts(vector[:-2]),
                                   'sum': None if math.isnan(total) else total, 'count': vector[-1]})
            else:
                scalars.append({'series_id': sid, 'ts': ts, 'value': vector[0]})
        flush(False)
    flush(True)
    op.drop_table('scrape_samples')
