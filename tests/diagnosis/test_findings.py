"""A finding's evidence survives its trip through the store's JSON column unchanged."""

from __future__ import annotations

import json

from app.diagnosis.findings import Evidence, Finding


def test_evidence_reads_back_from_a_stored_finding_equal_to_what_was_written() -> None:
    written = [Evidence("queue share of TTFT", 0.82, ">=", 0.5, "ratio", True, "most of the wait"),
               Evidence("running batch", 3.0, "info", None),
               Evidence("p99 TTFT", 1.25, ">", 2.0, "s", False)]
    finding = Finding("queueing", "warning", 0.75, "requests wait", evidence=written,
                      window_start=100.0, window_end=400.0)
    stored = json.loads(json.dumps(finding.to_dict()))
    read = [Evidence.from_dict(e) for e in stored["evidence"]]
    assert read == written
    assert [e.text() for e in read] == ["queue share of TTFT = 0.82 (>= 0.50); most of the wait",
                                        "running batch = 3", "p99 TTFT = 1.25 s (> 2.00 s)"]
    assert stored["window"] == {"start": 100.0, "end": 400.0, "seconds": 300.0}


def test_evidence_without_the_optional_keys_takes_their_defaults() -> None:
    e = Evidence.from_dict({"name": "queue depth", "value": 12, "op": ">=", "threshold": 4})
    assert (e.unit, e.met, e.note) == ("", True, "")
    assert e.text() == "queue depth = 12 (>= 4)"
