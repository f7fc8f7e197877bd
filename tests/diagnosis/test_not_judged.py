"""Never "healthy" by omission: recorded SGLang and trtllm-serve pages through the real
parse -> adapter -> store -> signals -> rules path.

A recorded page is one snapshot; it is replayed as the end of a run that started at zero:
every counter and histogram grows linearly from 0 to the page's value, gauges hold the
page's value. For the SGLang 0.4 docs page the run is 1,000 s long, which is what its own
numbers imply (Little's law over the whole server: 3.1e6 s of request time in its e2e
histogram / 2,988 requests in the system ~ 1,040 s).
"""

from __future__ import annotations

from pathlib import Path

import pytest

from app.api.schemas import DiagnosisOut
from app.core.thresholds import Thresholds
from app.diagnosis import engine as diagnosis_engine
from app.diagnosis.findings import Diagnosis
from app.diagnosis.oneshot import EXIT_FINDING, EXIT_HEALTHY, EXIT_NOT_JUDGED, OneShotResult
from app.diagnosis.profile import HardwareProfile
from app.scrape.jobs import PageProcessor
from app.store import db
from app.store.record import ScrapeRecord
from app.store.writer import SampleWriter
from app.targets import repository as target_repository

EXPOSITION = Path(__file__).parents[1] / "fixtures" / "exposition"
T0 = 1_800_000_000.0


def _scaled(text: str, fraction: float) -> str:
    """The page with every counter and histogram sample scaled by ``fraction``; gauges kept."""
    types: dict[str, str] = {}
    out = []
    for line in text.splitlines():
        if line.startswith("# TYPE "):
            _, _, name, kind = line.split(" ", 3)
            types[name] = kind
        elif line and not line.startswith("#"):
            identity, _, value = line.rpartition(" ")
            name = identity.split("{", 1)[0]
            family = next((f for f in types if name == f or (name.startswith(f) and name[len(f):] in
                                                             ("_bucket", "_sum", "_count", "_total"))), name)
            if types.get(family, "gauge") != "gauge":
                line = f"{identity} {float(value) * fraction!r}"
        out.append(line)
    return "\n".join(out) + "\n"


def replay(tmp_path: Path, filename: str, lifetime: float = 1000.0, every: float = 10.0,
           window: float = 60.0, hardware: HardwareProfile | None = None) -> tuple[list[Diagnosis], list[ScrapeRecord]]:
    text = (EXPOSITION / filename).read_text()
    url = f"sqlite:///{tmp_path / 'replay.db'}"
    db.upgrade(url)
    sql = db.make_engine(url)
    try:
        sessions = db.make_sessionmaker(sql)
        with sessions.begin() as session:
            target_id = target_repository.create_target(session, name="t", url="http://127.0.0.1/metrics",
                                                        engine="auto",
                                                 labels={}).id
        processor, records = PageProcessor("auto"), []
        steps = int(lifetime / every)
        for i in range(steps + 1):
            page, canonical, error = processor.process(_scaled(text, i / steps))
            assert error is None, error
            records.append(ScrapeRecord(target_id, T0 + i * every, True, 0.001, 0, page.samples_seen,
                                        page.samples_kept, page.malformed, processor.engine, None, None, canonical))
        SampleWriter(sql).write(records)
        with sessions() as session:
            diagnoses = diagnosis_engine.evaluate_target(session, target_id, "t", processor.engine or "",
                                                         T0 + steps * every, window, Thresholds(), hardware)
    finally:
        sql.dispose()
    return diagnoses, records


def test_sglang_04_loaded_page_is_queueing_from_its_gauges(tmp_path: Path) -> None:
    """2,826 waiting, 162 running, a 213 s mean TTFT and no queue-time histogram: queueing, not healthy."""
    (d,), records = replay(tmp_path, "sglang-v0.4-docs-production_metrics.prom")
    assert d.engine == "sglang" and d.verdict == "queueing"
    finding = d.findings[0]
    assert finding.severity == "critical"
    evidence = {e.name: e for e in finding.evidence}
    queue = evidence["mean queue time"]
    # Little's law: 2,826 waiting / (11,008 first tokens / 1,000 s) = 256.7 s
    assert queue.value == pytest.approx(2826 / (11008 / 1000), rel=1e-6)
    assert "Little's law" in queue.note and "no queue-time histogram" in queue.note
    assert evidence["queue share of TTFT"].value == 1.0  # 256.7 s against a 213.6 s mean TTFT: capped
    assert evidence["TTFT mean"].value == pytest.approx(2351897.9474117756 / 11008, rel=1e-9)
    assert "estimated from the waiting gauge" in finding.summary
    assert any("--max-running-requests" in r for r in finding.remedies)  # phrased for SGLang
    # what this 0.4 page cannot tell is listed, with the reason; the mean prompt length it does allow is
    # derived from the prompt-token counter over the finished requests its e2e histogram counts
    not_judged = {n["regime"]: n["reason"] for n in d.not_judged}
    assert set(not_judged) == {"prefill_compute", "weights_offloaded"}
    assert not_judged["prefill_compute"] == "needs prefill time, which this sglang target's window does not have"
    assert d.signals["prompt_mean_counters"] == pytest.approx(8.128902e6 / 11228, rel=1e-9)  # 724 tokens
    assert d.signals["output_mean_counters"] == pytest.approx(7.557572e6 / 11228, rel=1e-9)  # 673 tokens
    assert d.signals["finished_per_second"] == pytest.approx(11.228, rel=1e-9)
    assert d.signals["first_tokens_per_second"] == pytest.approx(11.008, rel=1e-9)
    assert d.signals["derived"]["prompt_mean_counters"] == (
        "increase(prompt_tokens_total) / increase(e2e _count) (the engine has no request counter) over the window")
    result = OneShotResult("http://sglang:30000/metrics", "sglang", records, {}, [d])
    assert result.exit_code == EXIT_FINDING


def test_trtllm_page_without_per_step_itl_is_not_called_healthy_silently(tmp_path: Path) -> None:
    (d,), records = replay(tmp_path, "trtllm-serve-constructed.prom", lifetime=120.0)
    assert d.engine == "trtllm"
    # the page's speculation accepts 300 of 1,200 draft tokens, 1.25 tokens per verification step: below
    # the thresholds (0.3, 1.5), so judged and found; trtllm-serve counts no steps, so they are estimated
    # from the generated tokens: the counters grow evenly over 120 s, 200 of the 400 fall in the 60 s window
    assert d.verdict == "speculation_ineffective" and [f.regime for f in d.findings] == ["speculation_ineffective"]
    evidence = {e.name: e for e in d.findings[0].evidence}
    assert evidence["draft acceptance rate"].value == pytest.approx(300 / 1200)
    assert evidence["mean tokens per verification step"].value == pytest.approx(1.25)
    assert evidence["verification steps with a draft"].value == pytest.approx(200 / 1.25)
    assert evidence["verification steps with a draft"].note.startswith("estimated: generated tokens")
    not_judged = {n["regime"]: n["reason"] for n in d.not_judged}
    # prefill_compute is judged: the prompt-token and request counters give the mean prompt length
    # (10,240 tokens / 20 requests = 512, below the long-prompt threshold), no histogram needed
    assert set(not_judged) == {"prefill_interference", "bandwidth_bound", "weights_offloaded"}
    assert d.signals["prompt_mean_counters"] == pytest.approx(10240 / 20)
    assert not_judged["bandwidth_bound"] == ("needs per-step ITL histogram, which this trtllm target's window does "
                                             "not have")
    assert not_judged["prefill_interference"] == not_judged["bandwidth_bound"]  # the ITL, not the prompt length
    # queueing was judged from the real queue histogram: mean queue 0.099 s < 0.5 s
    assert d.signals["queue_time"]["mean"] == pytest.approx(0.3975 / 4)
    result = OneShotResult("http://trt:8000/metrics", "trtllm", records, {}, [d])
    assert result.exit_code == EXIT_FINDING
    d.findings, d.verdict = [], "not_judged"  # without the finding: the verdict the regimes not judged make
    assert result.exit_code == EXIT_NOT_JUDGED
    # the API carries it, field by field
    out = DiagnosisOut.model_validate(d.to_dict())
    assert [(n.regime, n.reason) for n in out.not_judged] == [(k, v) for k, v in not_judged.items()]


def test_a_fully_judged_healthy_diagnosis_still_exits_0(tmp_path: Path) -> None:
    (d,), records = replay(tmp_path, "sglang-0.5-pd-constructed.prom", lifetime=120.0)
    d.not_judged, d.findings, d.verdict = [], [], "healthy"
    assert OneShotResult("http://x/metrics", "sglang", records, {}, [d]).exit_code == EXIT_HEALTHY
