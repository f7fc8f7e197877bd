"""Raw samples as one row per scrape (``scrape_samples``): the encoding, what the readers get
back, two rows of a target in one millisecond, and series absent from some of their
target's scrapes (the downsample round compares its rows with the target's rows)."""

from __future__ import annotations

import math
import struct

import pytest
from sqlalchemy import text

from app.store import repository, retention
from app.store.encoding import decode_counts, decode_scrape, encode_counts, encode_scrape, snapshot_blob
from app.store.writer import SampleWriter
from app.targets import repository as target_repository
from tests.store.test_levels import rebuilt_levels, stored_levels
from tests.store.test_storage import record

T0 = 1_700_006_400.0  # a UTC midnight


def bits(values) -> list[bytes]:
    """Floats by their bytes: -0.0 differs from 0.0, NaN equals NaN."""
    return [struct.pack("<d", v) for v in values]


def test_a_scrape_round_trips_exactly_and_readers_take_only_their_series() -> None:
    whole = encode_counts((1, 5, 9))  # uint32
    fractional = encode_counts((0.5, 2.25, 1e300))  # float64
    blob = encode_scrape([(7, snapshot_blob(whole, math.nan, 9.0)), (8, snapshot_blob(fractional, -0.0, 3.0))],
                         [(9, -0.0), (70_000, 1.5e-300)])
    decoded = dict(decode_scrape(blob, {7, 8, 9, 70_000}))
    assert decoded[7][:3] == (1, 5, 9) and math.isnan(decoded[7][3]) and decoded[7][4] == 9.0
    assert bits(decoded[8]) == bits((0.5, 2.25, 1e300, -0.0, 3.0))
    assert bits(decoded[9]) == bits((-0.0,)) and decoded[70_000] == (1.5e-300,)
    assert list(decode_scrape(blob, {8})) == [(8, decoded[8])]
    assert list(decode_scrape(blob, set())) == []
    # 7 bytes of entry head each; the histograms' blobs as they are; a scalar's 8 bytes
    assert len(blob) == 4 * 7 + (1 + 12 + 16) + (1 + 24 + 16) + 2 * 8
    corrupt = blob[:4] + b"\x05" + blob[5:]
    with pytest.raises(ValueError, match="unknown sample entry kind 5"):
        list(decode_scrape(corrupt, {7}))


def test_rows_of_the_first_encoding_read_back_and_are_what_short_entries_still_are() -> None:
    """Rows written before long entries existed: each entry a ``<IBH`` head (series id, kind,
    payload bytes) and its payload. They decode as they did, and an entry under 64 KiB is still
    written byte for byte the same."""
    counts = struct.pack("<c3I", b"I", 1, 5, 9) + struct.pack("<dd", 2.5, 9.0)
    old = (struct.pack("<IBH", 7, 0, len(counts)) + counts + struct.pack("<IBHd", 9, 1, 8, -0.0)
           + struct.pack("<IBHd", 70_000, 1, 8, 1.5e-300))
    assert dict(decode_scrape(old, {7, 9, 70_000})) == {7: (1, 5, 9, 2.5, 9.0), 9: (-0.0,), 70_000: (1.5e-300,)}
    assert encode_scrape([(7, snapshot_blob(encode_counts((1, 5, 9)), 2.5, 9.0))],
                         [(9, -0.0), (70_000, 1.5e-300)]) == old


@pytest.mark.parametrize(("counts", "long"), [
    ((7.0,) * 16_379, False), ((7.0,) * 16_380, True),          # uint32: 65,533 and 65,537 payload bytes
    ((0.5,) * 8_189, False), ((0.5,) * 8_190, True),            # float64: 65,529 and 65,537
    (tuple(float(i) for i in range(1_000_000)), True),          # 4 MB: any count the format allows
])
def test_an_entry_of_64_kib_or_more_takes_the_long_kind_and_round_trips(counts, long) -> None:
    blob = snapshot_blob(encode_counts(counts), 1.5, counts[-1])
    small = snapshot_blob(encode_counts((1, 2)), 0.0, 2.0)  # 25 bytes
    row = encode_scrape([(3, small), (4, blob)], [(5, 0.25)])
    sid, kind, size = struct.unpack_from("<IBH", row, 7 + len(small))
    assert (sid, kind, size) == ((4, 2, 0) if long else (4, 0, len(blob)))
    if long:
        assert struct.unpack_from("<I", row, 7 + len(small) + 7) == (len(blob),)
    assert len(row) == (7 + len(small)) + (11 if long else 7) + len(blob) + 15
    decoded = dict(decode_scrape(row, {3, 4, 5}))
    assert bits(decoded[4]) == bits((*counts, 1.5, counts[-1]))
    assert decoded[3] == (1, 2, 0.0, 2.0) and decoded[5] == (0.25,)
    assert list(decode_scrape(row, {5})) == [(5, (0.25,))]  # skipped over, long or not


@pytest.mark.parametrize(("counts", "tag", "width"), [
    ((0.0, 3.0, 4294967295.0), b"I", 4),          # whole floats below 2**32: uint32
    ((0, 3, 7), b"I", 4),                          # ints as well
    ((0, 3.0, 7), b"I", 4),                        # and a mix
    ((-1.0, 3.0), b"d", 8),                        # whole but negative: float64
    ((1.0, 4294967296.0), b"d", 8),                # whole but >= 2**32
    ((1.0, math.inf), b"d", 8), ((math.nan, 2.0), b"d", 8), ((1, 2.5), b"d", 8),
])
def test_counts_are_uint32_exactly_when_every_one_fits(counts, tag, width) -> None:
    blob = encode_counts(counts)
    assert blob[:1] == tag and len(blob) == 1 + width * len(counts)
    assert bits(decode_counts(blob)) == bits(counts)


def test_each_scrape_is_one_row_and_reads_back_exactly(store) -> None:
    engine, sessions, target_id = store
    records = [record(target_id, T0 + 15 * i, (i, 2 * i, 3 * i, 4 * i, 4 * i), 0.5 * i, 10.0 * i,
                      kv=math.nan if i == 2 else i / 10) for i in range(5)]
    assert SampleWriter(engine).write(records) == 5
    with engine.connect() as conn:
        assert conn.execute(text("SELECT count(*) FROM scrape_samples")).scalar() == 5
    with sessions() as session:
        (ttft,) = repository.find_series(session, [target_id], ["ttft"])
        kv, tokens = (repository.find_series(session, [target_id], [name])[0] for name in ("kv_usage",
                                                                                            "generation_tokens_total"))
        snapshots = repository.histogram_snapshots(session, [ttft.id], T0, T0 + 60)[ttft.id]
        assert [(s.ts, s.counts, s.sum, s.count) for s in snapshots] == [
            (T0 + 15 * i, (i, 2 * i, 3 * i, 4 * i, 4 * i), 0.5 * i, 4 * i) for i in range(5)]
        points = repository.scalar_points(session, [kv.id, tokens.id], T0 + 1, T0 + 60)
        assert points[kv.id] == [(T0 + 15, 0.1), (T0 + 45, 0.3), (T0 + 60, 0.4)]  # the NaN is not stored
        assert points[tokens.id] == [(T0 + 15 * i, 10.0 * i) for i in range(1, 5)]


def test_two_rows_of_a_target_in_one_millisecond_keep_each_series_first_sample(store) -> None:
    """As Prometheus keeps one sample a millisecond: the first row's, and a series the first
    row lacks from the second; another target's row in the same millisecond is its own."""
    engine, sessions, target_id = store
    with sessions.begin() as session:
        other = target_repository.create_target(session, name="t2", url="http://127.0.0.1:2/metrics").id
    first = record(target_id, T0, (1, 1, 1, 1, 1), 1.0, 5.0, kv=math.nan)
    second = record(target_id, T0 + 0.0002, (2, 2, 2, 2, 2), 2.0, 6.0, kv=0.75)
    beside = record(other, T0, (3, 3, 3, 3, 3), 3.0, 7.0, kv=0.25)
    assert SampleWriter(engine).write([first, second, beside]) == 3
    with sessions() as session:
        series = {(s.target_id, s.signal): s.id for s in repository.find_series(
            session, [target_id, other], ["ttft", "kv_usage", "generation_tokens_total"])}
        ms = round(T0 * 1000)
        samples = sorted(repository._raw_samples(session, list(series.values()), ms, ms, closed=True))
    by_series = {(t, signal): [v for sid, _, v in samples if sid == series[(t, signal)]]
                 for t, signal in series}
    assert by_series[(target_id, "ttft")] == [(1, 1, 1, 1, 1, 1.0, 1)]
    assert by_series[(target_id, "generation_tokens_total")] == [(5.0,)]
    assert by_series[(target_id, "kv_usage")] == [(0.75,)]  # only the second row has it
    assert by_series[(other, "ttft")] == [(3, 3, 3, 3, 3, 3.0, 3)] and by_series[(other, "kv_usage")] == [(0.25,)]
    assert len(samples) == 6


def test_series_absent_from_some_scrapes_get_exact_levels(store) -> None:
    """A gauge that is NaN in some scrapes and a model that goes away halfway: the round
    counts the target's rows, finds those series' rows short of them, rebuilds them from the
    raw samples and stores what a round over the raw samples alone stores."""
    engine, sessions, target_id = store
    records = []
    for i in range(240):  # an hour
        r = record(target_id, T0 + 15 * i, (i, i, 2 * i, 2 * i, 3 * i), 0.1 * i, 5.0 * i,
                   kv=math.nan if i % 7 == 0 else (i % 10) / 10)
        if i < 130:
            gone = record(target_id, r.ts, (i, i, i, i, i), 0.2 * i, 1.0 * i, model="gone")
            r.canonical.histograms.extend(gone.canonical.histograms)
            r.canonical.scalars.extend(gone.canonical.scalars)
        records.append(r)
    writer = SampleWriter(engine)
    for i in range(0, len(records), 40):
        assert writer.write(records[i:i + 40]) == 40
    now = T0 + 2 * 3600
    written = retention.downsample(sessions, now=now)
    assert written[300] == 12 * 3 + 7 * 3  # model "m" in every interval, "gone" in the first 7 (130 scrapes)
    after_round = stored_levels(engine)
    assert after_round == rebuilt_levels(engine, sessions, now)
    with sessions() as session:
        (kv,) = [s for s in repository.find_series(session, [target_id], ["kv_usage"]) if s.model == "m"]
    kv_rows = {key[2]: row for key, row in after_round.items() if key[0] == kv.id and key[1] == 300}
    assert [kv_rows[T0 + 300 * k][3] for k in range(12)] == [
        sum(1 for i in range(20 * k, 20 * k + 20) if i % 7) for k in range(12)]


def test_a_histograms_series_follows_its_bounds_values_not_the_tuple_object(store) -> None:
    """The writer looks bounds up by identity first (adapters reuse the tuple): an equal
    tuple made anew, or a tuple whose id is reused, must still find the right series."""
    engine, sessions, target_id = store
    from app.sources.base import CanonicalHistogram

    writer = SampleWriter(engine)

    def one(ts: float, bounds: tuple[float, ...]):
        r = record(target_id, ts, (1.0, 2.0, 3.0, 4.0, 5.0), 1.0, 10.0)
        h = r.canonical.histograms[0]
        r.canonical.histograms[0] = CanonicalHistogram(h.signal, h.model, h.rank, bounds, h.counts, h.sum, h.count)
        return r

    same = (0.1, 0.5, 1.0, 2.5, math.inf)
    assert writer.write([one(T0, same), one(T0 + 15, same), one(T0 + 30, tuple(list(same)))]) == 3
    other = (0.2, 0.5, 1.0, 2.5, math.inf)
    assert writer.write([one(T0 + 45, other)]) == 1
    with sessions() as session:
        series = repository.find_series(session, [target_id], ["ttft"])
    assert sorted(s.bounds for s in series) == [(0.1, 0.5, 1.0, 2.5, math.inf), (0.2, 0.5, 1.0, 2.5, math.inf)]
    for _ in range(5000):  # more tuples than the identity cache holds, made and dropped
        writer._bounds(tuple(list(other)))
    assert len(writer._bounds_by_id) <= 4096
    assert writer._bounds(same) == repository.bounds_key(repository.encode_floats(same))
