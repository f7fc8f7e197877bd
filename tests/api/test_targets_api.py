"""Targets API on SQLite and PostgreSQL: CRUD, validation, auth, latency from real scrapes."""

from __future__ import annotations

import math
import time
from pathlib import Path

import pytest

from app.core import quantiles
from tests.api.conftest import make_service
from tests.support.engine_pages import VLLM_ITL_BUCKETS, VLLM_TTFT_BUCKETS, VllmPage
from tests.support.pages import StaticPageServer


def test_crud_and_validation(service) -> None:
    c = service.client
    created = c.post("/api/v1/targets", json={"name": "a", "url": "http://127.0.0.1:9/metrics",
                                              "scrape_interval": "30s", "labels": {"cluster": "x"}})
    assert created.status_code == 201, created.text
    body = created.json()
    assert (body["name"], body["scrape_interval_seconds"], body["engine"], body["source"]) == ("a", 30.0, "auto", "api")

    bad = c.post("/api/v1/targets", json={"name": "b", "url": "file:///etc/passwd"})
    assert bad.status_code == 422
    assert bad.json()["detail"] == [{"loc": ["body", "url"], "msg": "URL scheme must be http or https, got 'file'",
                                     "type": "value_error"}]
    bad = c.post("/api/v1/targets", json={"name": "b", "url": "http://x/m", "engine": "triton"})
    assert bad.status_code == 422 and bad.json()["detail"][0]["loc"] == ["body", "engine"]
    bad = c.post("/api/v1/targets", json={"name": "b", "url": "http://x/m", "scrape_interval": "often"})
    assert bad.status_code == 422 and "not a duration: 'often'" in bad.json()["detail"][0]["msg"]
    assert c.post("/api/v1/targets", json={"name": "a", "url": "http://127.0.0.1:9/m"}).status_code == 409

    assert c.get("/api/v1/targets/nope").status_code == 404
    assert c.get("/api/v1/targets/nope/latency").json()["detail"] == "target 'nope' not found"
    patched = c.patch("/api/v1/targets/a", json={"scrape_interval": "1m"})
    assert patched.status_code == 200 and patched.json()["scrape_interval_seconds"] == 60.0
    bad = c.patch("/api/v1/targets/a", json={"scrape_timeout": "2m"})
    assert bad.status_code == 422 and "scrape_timeout must not exceed scrape_interval" in bad.json()["detail"][0]["msg"]
    assert [t["name"] for t in c.get("/api/v1/targets").json()] == ["a"]
    assert "a" in service.monitor.scraping.scrapers
    assert c.delete("/api/v1/targets/a").status_code == 204
    assert c.get("/api/v1/targets/a").status_code == 404
    assert "a" not in service.monitor.scraping.scrapers


def test_write_endpoints_need_the_token(migrated_url: str, tmp_path: Path) -> None:
    for svc in make_service(migrated_url, tmp_path, api_token="s3cret"):
        c = svc.client
        body = {"name": "a", "url": "http://127.0.0.1:9/metrics"}
        assert c.post("/api/v1/targets", json=body).status_code == 401
        assert c.post("/api/v1/targets", json=body, headers={"Authorization": "Bearer wrong"}).status_code == 401
        assert c.post("/api/v1/targets", json=body, headers={"Authorization": "Bearer s3cret"}).status_code == 201
        assert c.delete("/api/v1/targets/a").status_code == 401
        assert c.get("/api/v1/targets").status_code == 200  # reads stay open


def test_allowed_hosts_block_other_urls(migrated_url: str, tmp_path: Path) -> None:
    for svc in make_service(migrated_url, tmp_path, allowed_target_hosts=["10.0.0.0/8"]):
        r = svc.client.post("/api/v1/targets", json={"name": "a", "url": "http://169.254.169.254/latest/meta-data"})
        assert r.status_code == 422
        assert r.json()["detail"][0]["msg"] == "host '169.254.169.254' is not in allowed_target_hosts"


def test_latency_from_two_real_scrapes_matches_hand_computed_quantiles(service) -> None:
    page = VllmPage(model="llama")
    page.observe(ttft=[0.05] * 10, itl=[0.02] * 50)
    with StaticPageServer(page.render()) as server:
        assert service.client.post("/api/v1/targets", json={"name": "v", "url": server.url}).status_code == 201
        first = service.scrape("v")
        assert (first.up, first.engine, first.error_class) == (True, "vllm", None)
        # between the scrapes: 20 requests with TTFT 0.3 s and 10 with 3 s; 100 ITL gaps of 0.06 s
        page.observe(ttft=[0.3] * 20 + [3.0] * 10, itl=[0.06] * 100)
        server.page = page.render()
        time.sleep(0.01)
        second = service.scrape("v")
    window = (quantiles.to_millis(second.ts) - quantiles.to_millis(first.ts)) / 1000  # Prometheus works in ms
    r = service.client.get("/api/v1/targets/v/latency", params={"start": first.ts, "end": second.ts})
    assert r.status_code == 200, r.text
    body = r.json()
    assert body["engine"] == "vllm"
    ttft = body["ttft"]
    assert ttft["count"] == 30.0
    # p50: rank 15 of 30 lies in (0.25, 0.5] which holds the 20 TTFTs of 0.3 s -> 0.25 + 0.25 * 15/20
    assert ttft["p50"] == pytest.approx(0.25 + 0.25 * 15 / 20, rel=1e-12)
    # p90: rank 27 lies in (2.5, 5.0] holding 10 (ranks 21..30) -> 2.5 + 2.5 * (27 - 20) / 10
    assert ttft["p90"] == pytest.approx(2.5 + 2.5 * 7 / 10, rel=1e-12)
    assert ttft["mean"] == pytest.approx((20 * 0.3 + 10 * 3.0) / 30, rel=1e-9)
    itl = body["itl"]
    assert itl["count"] == 100.0
    assert itl["p99"] == pytest.approx(0.05 + 0.025 * 99 / 100, rel=1e-12)
    assert body["queue_time"]["count"] == 30.0
    assert body["rates"]["generation_tokens_per_second"] == pytest.approx(100 / window, rel=1e-9)
    assert set(body["models"]) == {"llama"} and body["models"]["llama"]["ttft"]["p50"] == ttft["p50"]
    # the same numbers through the quantile module directly
    cumulative = [sum(1 for v in [0.3] * 20 + [3.0] * 10 if v <= b) for b in (*VLLM_TTFT_BUCKETS, math.inf)]
    assert ttft["p99"] == pytest.approx(quantiles.histogram_quantile(0.99, (*VLLM_TTFT_BUCKETS, math.inf), cumulative))
    assert len(VLLM_ITL_BUCKETS) == 19


def test_series_endpoint_and_bad_parameters(service) -> None:
    page = VllmPage()
    with StaticPageServer(page.render()) as server:
        service.client.post("/api/v1/targets", json={"name": "v", "url": server.url})
        records = []
        for i in range(3):
            page.observe(ttft=[0.5] * (i + 1))
            server.page = page.render()
            records.append(service.scrape("v"))
            time.sleep(0.02)
    end = math.ceil(records[-1].ts)  # the last aligned point then follows every scrape
    r = service.client.get("/api/v1/targets/v/series", params={"signal": "ttft", "q": "0.5", "step": "1s",
                                                                "window": "5s", "lookback": "1m", "end": end})
    assert r.status_code == 200, r.text
    points = r.json()["points"]
    assert len(points) in (5, 6)
    assert points[-1]["value"] is not None and 0.25 < points[-1]["value"] <= 0.5
    bad = service.client.get("/api/v1/targets/v/series", params={"signal": "nope"})
    assert bad.status_code == 422 and bad.json()["detail"][0]["loc"] == ["query", "signal"]
    bad = service.client.get("/api/v1/targets/v/series", params={"q": "1.5"})
    assert bad.status_code == 422 and bad.json()["detail"][0]["loc"] == ["query", "q"]
    bad = service.client.get("/api/v1/targets/v/latency", params={"window": "5 minutes"})
    assert bad.status_code == 422 and bad.json()["detail"][0]["loc"] == ["query", "window"]


def test_restart_between_scrapes_never_gives_negative_counts(service) -> None:
    page = VllmPage()
    page.observe(ttft=[1.0] * 50)
    with StaticPageServer(page.render()) as server:
        service.client.post("/api/v1/targets", json={"name": "v", "url": server.url})
        first = service.scrape("v")
        page.restart()
        page.observe(ttft=[0.05] * 4)
        server.page = page.render()
        second = service.scrape("v")
    body = service.client.get("/api/v1/targets/v/latency",
                              params={"start": first.ts, "end": second.ts}).json()
    # Prometheus' reset rule: after a drop the new value counts in full -> 4 observations
    assert body["ttft"]["count"] == 4.0
    assert body["ttft"]["p50"] == pytest.approx(0.04 + 0.02 * 2 / 4, rel=1e-12)


def test_bad_targets_are_recorded_and_never_stop_the_others(service) -> None:
    good = VllmPage()
    good.observe(ttft=[0.1])

    def slow() -> bytes:
        time.sleep(3)
        return good.render()

    with StaticPageServer(good.render()) as ok, StaticPageServer(b"\x00\xff garbage \x8f" * 100) as garbage, \
            StaticPageServer(b"x" * 300_000) as huge, StaticPageServer(good.render()) as failing, \
            StaticPageServer(slow) as slow_server, StaticPageServer("# HELP x y\nfoo_total 3\n") as foreign:
        failing.status = 500
        urls = {"ok": ok.url, "garbage": garbage.url, "huge": huge.url, "failing": failing.url,
                "slow": slow_server.url, "refused": "http://127.0.0.1:1/metrics", "foreign": foreign.url}
        for name, url in urls.items():
            assert service.client.post("/api/v1/targets", json={"name": name, "url": url}).status_code == 201
        results = {name: service.scrape(name) for name in urls}
        truncated = good.render()
        ok.page = truncated[: len(truncated) // 2]  # cut mid-page
        partial = service.scrape("ok")
    classes = {name: (r.up, r.error_class) for name, r in results.items()}
    assert classes == {
        "ok": (True, None), "garbage": (False, "parse_error"), "huge": (False, "too_large"),
        "failing": (False, "http_status"), "slow": (False, "timeout"), "refused": (False, "connect"),
        "foreign": (True, "no_engine_metrics"),
    }
    assert "cannot be diagnosed from metrics" in results["foreign"].error
    assert partial.up and partial.samples_kept > 0
    health = {h["target"]: h for h in service.client.get("/api/v1/scrape-health").json()}
    assert health["ok"]["scrapes"] == 2 and health["ok"]["failed"] == 0
    assert health["slow"]["last"]["error_class"] == "timeout"
    assert health["huge"]["last"]["error"] == "page is 300000 bytes, limit 200000"
    metrics = service.client.get("/metrics").text
    assert 'llm_latency_target_up{target="ok"} 1.0' in metrics
    assert 'llm_latency_target_up{target="refused"} 0.0' in metrics
    assert 'llm_latency_scrapes_total{result="timeout",target="slow"} 1.0' in metrics


def test_a_target_past_its_limits_is_down_with_the_limit_named_and_the_others_are_stored(service) -> None:
    """Limits per target through the API, the service's defaults shown where it sets none. A page
    that renames its models every scrape brings 21 new rows a scrape (22 the first): with a
    stored_series_limit of 100 the fifth scrape is refused, down with the numbers in its error
    and on /metrics, while the target scraped and written beside it is stored. A higher limit takes
    the next page."""
    from tests.scrape.test_limits import page_of

    c = service.client
    renames = iter(range(100))
    with StaticPageServer(lambda: page_of([f"m{next(renames)}"])) as rotating, \
            StaticPageServer(page_of(["tiny"])) as steady:
        created = c.post("/api/v1/targets", json={"name": "rotating", "url": rotating.url,
                                                  "stored_series_limit": 100})
        assert created.status_code == 201, created.text
        body = created.json()
        assert (body["sample_limit"], body["series_limit"], body["stored_series_limit"]) == (50_000, 5_000, 100)
        assert c.post("/api/v1/targets", json={"name": "steady", "url": steady.url}).status_code == 201
        bad = c.post("/api/v1/targets", json={"name": "b", "url": steady.url, "sample_limit": 0})
        assert bad.status_code == 422 and bad.json()["detail"][0]["loc"] == ["body", "sample_limit"]
        bad = c.patch("/api/v1/targets/steady", json={"series_limit": 2**31})
        assert bad.status_code == 422 and bad.json()["detail"][0]["loc"] == ["body", "series_limit"]
        stored = []
        for _ in range(6):  # both scraped, then written in one batch
            for name in ("rotating", "steady"):
                c.portal.call(service.monitor.scraping.scrape_now, name)
            c.portal.call(service.monitor.scraping.flush)
            last = {t["name"]: t["last_scrape"] for t in c.get("/api/v1/targets").json()}
            stored.append((last["rotating"]["up"], last["rotating"]["error_class"], last["steady"]["up"]))
        assert stored == [(True, None, True)] * 4 + [(False, "too_many_series", True)] * 2
        assert last["rotating"]["error"] == (
            "the page has 21 new series and the target 85 stored, over its stored_series_limit of 100; nothing of "
            "it was stored: raise the limit, or delete the target to drop its series")
        health = {h["target"]: (h["scrapes"], h["failed"]) for h in c.get("/api/v1/scrape-health").json()}
        assert health == {"rotating": (6, 2), "steady": (6, 0)}
        metrics = c.get("/metrics").text
        assert 'llm_latency_target_up{target="rotating"} 0.0' in metrics
        assert 'llm_latency_target_up{target="steady"} 1.0' in metrics
        assert 'llm_latency_storage_writes_total{result="refused"} 2.0' in metrics
        assert 'llm_latency_storage_writes_total{result="ok"} 10.0' in metrics

        patched = c.patch("/api/v1/targets/rotating", json={"stored_series_limit": 1000})
        assert patched.status_code == 200 and patched.json()["stored_series_limit"] == 1000
        assert service.scrape("rotating").up
        assert c.get("/api/v1/targets/rotating").json()["last_scrape"]["error_class"] is None


def test_health_readiness_and_derived_metrics(service) -> None:
    c = service.client
    assert c.get("/healthz").json() == {"status": "ok"}
    assert c.get("/readyz").json()["status"] == "ok"
    page = VllmPage(model="llama")
    with StaticPageServer(page.render()) as server:
        c.post("/api/v1/targets", json={"name": "v", "url": server.url})
        service.scrape("v")
        page.observe(ttft=[0.3] * 10)
        server.page = page.render()
        service.scrape("v")
    service.monitor.refresh_summaries()
    text = c.get("/metrics").text
    line = next(row for row in text.splitlines()
                if row.startswith('llm_latency_quantile_seconds{model="llama",quantile="0.5",'
                                  'signal="ttft",target="v"}'))
    assert 0.25 < float(line.split()[-1]) <= 0.5
    assert 'llm_latency_observations{model="llama",signal="ttft",target="v"}' in text
    assert c.get("/docs").status_code == 200
    assert "/api/v1/targets/{name}/latency" in c.get("/openapi.json").json()["paths"]


def test_fleet_view_sums_targets_and_a_gzip_bomb_is_refused(service) -> None:
    a, b = VllmPage(model="m1"), VllmPage(model="m2")
    with StaticPageServer(a.render()) as sa, StaticPageServer(b.render()) as sb, \
            StaticPageServer(b"# x\n" + b"0" * 5_000_000) as bomb:
        bomb.gzip = True  # 5 MB of zeros compress to a few kB on the wire
        for name, server in (("a", sa), ("b", sb), ("bomb", bomb)):
            assert service.client.post("/api/v1/targets", json={"name": name, "url": server.url}).status_code == 201
        firsts = [service.scrape("a"), service.scrape("b")]
        a.observe(ttft=[0.3] * 10)
        b.observe(ttft=[3.0] * 30)
        sa.page, sb.page = a.render(), b.render()
        lasts = [service.scrape("a"), service.scrape("b")]
        refused = service.scrape("bomb")
    assert (refused.up, refused.error_class) == (False, "too_large")
    assert refused.error == "page exceeds the 200000-byte limit"
    window = {"start": min(r.ts for r in firsts) - 0.001, "end": max(r.ts for r in lasts) + 0.001}
    fleet = service.client.get("/api/v1/latency", params=window).json()
    per_target = [service.client.get(f"/api/v1/targets/{n}/latency", params=window).json() for n in ("a", "b")]
    assert fleet["targets"] == ["a", "b", "bomb"]
    # sum by (le) across targets: the fleet count is the sum of the targets' (each
    # extrapolated to the window edges exactly as Prometheus' increase() would be)
    assert fleet["ttft"]["count"] == pytest.approx(sum(r["ttft"]["count"] for r in per_target), rel=1e-12)
    # 40 observed between the targets' two scrapes, extrapolated to the window's edges as extrapolatedRate
    # does, however long the scrapes took: not before the counters' zero (their first scrape), past the
    # last by at most 1.1 times the time between the two
    assert 40.0 <= fleet["ttft"]["count"] <= 40.0 * 2.1
    # 30 of ~40 observations are 3 s (bucket (2.5, 5.0]); 10 are 0.3 s: p50 lies in the 3 s bucket
    assert 2.5 < fleet["ttft"]["p50"] <= 5.0 and per_target[0]["ttft"]["p50"] <= 0.5
    assert set(fleet["models"]) == {"m1", "m2"}


def test_a_pd_decode_worker_gets_its_ttft_split_across_the_prefill_worker(service) -> None:
    from prometheus_client import Histogram

    prefill, decode = VllmPage(model="llama"), VllmPage(model="llama")
    xfer = Histogram("vllm:nixl_xfer_time_seconds", "NIXL transfer", ["model_name", "engine"],
                     buckets=(0.005, 0.01, 0.025, 0.05, 0.075, 0.1, 0.2, 0.3, 0.5, 0.75, 1.0, 5.0),
                     registry=decode.registry)
    xfer.labels("llama", "0")  # vLLM creates each engine's series at start (create_metric_per_engine)
    with StaticPageServer(prefill.render()) as p_server, StaticPageServer(decode.render()) as d_server:
        assert service.client.post("/api/v1/targets", json={"name": "p", "url": p_server.url}).status_code == 201
        assert service.client.post("/api/v1/targets", json={
            "name": "d", "url": d_server.url, "labels": {"llm_latency_prefill_target": "p"}}).status_code == 201
        first = [service.scrape("p"), service.scrape("d")]
        prefill.observe(ttft=[0.4] * 10)  # queue 0.2 + prefill 0.2 on the prefill worker
        decode.observe(ttft=[0.1] * 10)   # queue 0.05 + first step 0.05 on the decode worker
        for _ in range(10):
            xfer.labels("llama", "0").observe(0.3)
        p_server.page, d_server.page = prefill.render(), decode.render()
        time.sleep(0.01)
        second = [service.scrape("p"), service.scrape("d")]
    params = {"start": min(r.ts for r in first), "end": max(r.ts for r in second)}
    body = service.client.get("/api/v1/targets/d/latency", params=params).json()
    assert body["kv_transfer_time"]["count"] == 10.0 and body["kv_transfer_time"]["mean"] == pytest.approx(0.3)
    split = body["disaggregation"]
    assert split["prefill_target"] == "p"
    assert [split[k] for k in ("prefill_queue", "prefill", "kv_transfer", "decode_queue", "first_step")] == \
        pytest.approx([0.2, 0.2, 0.3, 0.05, 0.05])
    assert split["ttft_mean"] == pytest.approx(0.8) and "means add" in split["note"]
    assert split["prefill_targets"] == ["p"]
    # each term says what it was read from; vLLM has no decode-side prealloc (not in the total)
    assert split["decode_prealloc"] is None and split["kv_wait"] is None
    assert split["sources"]["kv_transfer"] == "decode worker: its transfer-time histogram"
    assert split["sources"]["decode_queue"] == "decode worker: queue-time histogram"
    assert split["sources"]["prefill_queue"] == "prefill worker: queue-time histogram"
    # vLLM exports no kv_role: the decode role comes from the transfers it records, and says so
    assert body["pd_role"]["role"] == "decode" and body["pd_role"]["source"].startswith("metrics: ")
    prefill_body = service.client.get("/api/v1/targets/p/latency", params=params).json()
    assert "disaggregation" not in prefill_body and "pd_role" not in prefill_body  # nothing says: no role
    # the status page shows the same split
    page = service.client.get("/targets/d", params={"window": "5m", "end": params["end"]}).text
    row = page[page.index('data-part="kv_transfer"'):]
    assert 'data-part="ttft_mean"' in page and 'href="/targets/p"' in page
    assert 'data-part="decode_prealloc"' not in page and "decode worker: its transfer-time histogram" in page
    assert float(row.split('data-value="')[1].split('"')[0]) == pytest.approx(0.3)
    assert 'data-role="decode"' in page and "records KV-cache transfers" in page
