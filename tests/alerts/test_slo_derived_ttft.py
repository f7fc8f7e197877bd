"""A TTFT objective reads queue and prefill only where the TTFT is derived from them: a vLLM
target's alert reads its TTFT histogram alone, a TGI target's (no TTFT histogram) its queue and
prefill, and its alert says the TTFT is derived and bounded."""

from __future__ import annotations

import re
from pathlib import Path

import yaml

from app.alerts.engine import slo_signals
from tests.api.conftest import make_service
from tests.support.engine_pages import VllmPage
from tests.support.pages import StaticPageServer

TGI_PAGE = (Path(__file__).parents[1] / "fixtures" / "exposition" / "tgi-3.3-constructed.prom").read_text()


def slower(page: str, family: str, extra: int, seconds: float) -> str:
    """``page`` with ``extra`` more observations of ``seconds`` in ``family`` (every series of it)."""
    def bump(match: re.Match) -> str:
        name, labels, value = match[1], match[2] or "", float(match[3])
        if name.endswith("_bucket"):
            le = re.search(r'le="([^"]+)"', labels)[1]  # type: ignore[index]
            value += extra if le == "+Inf" or float(le) >= seconds else 0
        else:
            value += extra * seconds if name.endswith("_sum") else extra
        return f"{name}{labels} {value:g}"
    return re.sub(rf"^({re.escape(family)}_(?:bucket|sum|count))(\{{[^}}]*\}})? (\S+)$", bump, page, flags=re.M)


def test_queue_and_prefill_are_read_only_for_a_derived_ttft(migrated_url: str, tmp_path: Path) -> None:
    assert slo_signals("ttft", "vllm") == ("ttft",) and slo_signals("itl", None) == ("itl",)
    assert slo_signals("ttft", "tgi") == slo_signals("ttft", None) == ("ttft", "queue_time", "prefill_time")
    vllm = VllmPage()
    with StaticPageServer(TGI_PAGE.encode()) as tgi, StaticPageServer(vllm.render()) as v:
        config = {"targets": [{"name": "t", "url": tgi.url, "engine": "tgi"}, {"name": "v", "url": v.url}],
                  "alerts": {"slos": [{"name": "ttft_p99", "signal": "ttft", "quantile": 0.99, "threshold": "0.5s",
                                       "window": "5m", "for": "0s"}]}}
        (tmp_path / "targets.yaml").write_text(yaml.safe_dump(config))
        for svc in make_service(migrated_url, tmp_path, config_file=tmp_path / "targets.yaml", alert_interval="1h"):
            asked: list[tuple[tuple[str, ...], tuple[str, ...]]] = []
            windows = svc.monitor.windows
            real = windows.histograms

            def recorded(session, targets, start, end, signals, above=None, real=real, asked=asked):  # type: ignore[no-untyped-def]
                asked.append((tuple(sorted(t.name for t in targets)), tuple(signals)))
                return real(session, targets, start, end, signals, above)

            windows.histograms = recorded  # type: ignore[method-assign]
            svc.scrape("t"), svc.scrape("v")
            tgi.page = slower(slower(TGI_PAGE, "tgi_request_queue_duration", 100, 10.0),
                              "tgi_batch_inference_duration", 100, 0.2).encode()
            vllm.observe(ttft=[3.0] * 100)
            v.page = vllm.render()
            svc.scrape("t"), svc.scrape("v")
            svc.monitor.evaluate_alerts()
            # the engine of v is detected from its page: TTFT only; t's queue and prefill besides
            assert asked == [(("t", "v"), ("ttft",)), (("t",), ("queue_time", "prefill_time"))], asked
            alerts = {a["labels"]["target"]: a for a in svc.client.get("/api/v1/alerts").json()}
            assert alerts.keys() == {"t", "v"}
            assert "derived from queue and prefill" in alerts["t"]["annotations"]["description"]
            assert alerts["t"]["annotations"]["summary"].startswith("t: p99 TTFT is at least ")
            assert "derived" not in alerts["v"]["annotations"]["description"]
            assert alerts["v"]["annotations"]["summary"].startswith("v: p99 TTFT is ")
