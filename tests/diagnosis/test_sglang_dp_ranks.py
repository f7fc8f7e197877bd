"""SGLang with DP attention labels its scheduler gauges *and* histograms with ``dp_rank``: each
rank's load and its own mean queue time are the ``dp_imbalance`` evidence, from a page in that form."""

from __future__ import annotations

from pathlib import Path

import pytest

from tests.diagnosis.test_not_judged import replay
from tests.fixtures.build_pages import TTFT_VALUES


def test_sglang_dp_ranks_from_gauges_and_queue_histograms(tmp_path: Path) -> None:
    (d,), _ = replay(tmp_path, "sglang-0.5-pd-constructed.prom", lifetime=120.0)
    assert d.engine == "sglang"
    ranks = d.signals["ranks"]
    assert [(r["target"], r["running_mean"], r["waiting_mean"]) for r in ranks] == [("0", 40.0, 25.0),
                                                                                     ("1", 6.0, 0.0)]
    # each rank's queue_time_seconds{dp_rank} mean: rank 0 waits TTFT/4, the idle rank 1 TTFT/400
    queued = sum(TTFT_VALUES) / len(TTFT_VALUES)
    assert ranks[0]["queue_mean"] == pytest.approx(queued / 4, rel=1e-9)
    assert ranks[1]["queue_mean"] == pytest.approx(queued / 400, rel=1e-9)
    assert d.signals["rank_kv_usage"] == {"0": pytest.approx(0.93), "1": pytest.approx(0.2)}
    finding = next(f for f in d.findings if f.regime == "dp_imbalance")
    evidence = {e.name: e for e in finding.evidence}
    assert evidence["load of the busiest / least busy rank"].value == pytest.approx(65 / 6)
    assert evidence["rank 0"].value == "running 40.0, waiting 25.0, KV usage 93%, mean queue time 99.4 ms"
    assert evidence["rank 1"].value == "running 6.0, waiting 0.0, KV usage 20%, mean queue time 1.0 ms"
    # the whole engine's queue time is both ranks' requests together, not either rank's
    assert d.signals["queue_time"]["mean"] == pytest.approx((queued / 4 + queued / 400) / 2, rel=1e-9)
