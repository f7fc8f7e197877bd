"""Every parameter the status pages and the routes backed by a Prometheus source take answers 4xx
when it is out of range, never 500: property tests over the parameter space, against a service
whose source is a scripted Prometheus on loopback (tests/promsource/test_hostile_answers.py's
answers, served as the HTTP API's JSON)."""

from __future__ import annotations

import json
from collections.abc import Iterator

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from app.promsource.queries import JOB_LABEL
from app.store import db
from tests.api.conftest import Service, make_service
from tests.promapi.local_api import Answer, LocalAPI, Received
from tests.promsource.test_hostile_answers import Sample, ScriptedPrometheus, kind_of, split_combined

SCRIPTED = ScriptedPrometheus()


def _api(request: Received) -> Answer:
    """``/api/v1/query`` and ``/api/v1/query_range`` as Prometheus answers them, from the script."""
    promql = request.params.get("query", [""])[0]
    if promql.endswith("]"):  # a range selector (TGI's KV samples): a matrix, none here
        data: dict = {"resultType": "matrix", "result": []}
    elif request.path.endswith("/query_range"):
        start, end, step = (float(request.params[k][0]) for k in ("start", "end", "step"))
        series = SCRIPTED.query_range(promql, start, end, step).data
        data = {"resultType": "matrix",
                "result": [{"metric": s.labels, "values": [[t, repr(v)] for t, v in s.points]} for s in series]}
    else:
        at = float(request.params.get("time", ["0"])[0])
        parts = split_combined(promql) or [(promql, None)]  # no configuration answered
        samples = [s if tag is None else Sample({**s.labels, JOB_LABEL: tag}, s.value) for branch, tag in parts
                   if kind_of(branch) != "infos" for s in SCRIPTED.query(branch, at).data]
        data = {"resultType": "vector",
                "result": [{"metric": s.labels, "value": [at, repr(s.value)]} for s in samples]}
    return Answer(body=json.dumps({"status": "success", "data": data}).encode())


@pytest.fixture(scope="module")
def sourced(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Service]:
    tmp = tmp_path_factory.mktemp("routes")
    url = f"sqlite:///{tmp / 'routes.db'}"
    db.upgrade(url)
    with LocalAPI(_api) as prometheus:
        config = tmp / "t.yaml"
        config.write_text(f"""
targets:
  - {{name: stored, url: "http://127.0.0.1:9/metrics"}}
diagnosis: {{interval: 1h, window: 60s}}
sources:
  - {{name: prod, url: "{prometheus.url}", selector: '{{namespace="llm"}}', target_labels: [namespace, pod]}}
""")
        for service in make_service(url, tmp, config_file=config):
            service.monitor.evaluate_diagnoses()
            assert {t["name"] for t in service.client.get("/api/v1/targets").json()} >= {"prod.llm.good", "stored"}
            yield service


NUMBERS = st.one_of(st.floats(allow_nan=True, allow_infinity=True).map(repr),
                    st.integers(-10**20, 10**20).map(str),
                    st.sampled_from(["0", "1", "1e306", "-1e308", "253402300799", "253402300800", "1e-320", "nan",
                                     "inf", "-0", "1796521266.0012", ""]),
                    st.text(max_size=12))
DURATIONS = st.one_of(st.sampled_from(["5m", "1s", "0s", "1ms", "999999999999d", "1e300s", "-5m", "31d", "32d",
                                       "1h30m", "", "5", "5 m"]),
                      st.from_regex(r"\A[0-9]{1,14}(ms|s|m|h|d|w|y)\Z"), st.text(max_size=10))


def _params(draw: st.DrawFn, names: dict[str, st.SearchStrategy[str]]) -> dict[str, str]:
    return {name: draw(values) for name, values in names.items() if draw(st.booleans())}


@st.composite
def latency_params(draw: st.DrawFn) -> dict[str, str]:
    return _params(draw, {"window": DURATIONS, "start": NUMBERS, "end": NUMBERS})


@st.composite
def series_params(draw: st.DrawFn) -> dict[str, str]:
    return _params(draw, {"signal": st.sampled_from(["ttft", "itl", "nope", ""]),
                          "q": st.one_of(NUMBERS, st.just("mean")), "step": DURATIONS, "window": DURATIONS,
                          "lookback": DURATIONS, "end": NUMBERS, "model": st.text(max_size=8)})


@st.composite
def page_params(draw: st.DrawFn) -> dict[str, str]:
    return _params(draw, {"window": DURATIONS, "end": NUMBERS})


def _ok_or_4xx(service: Service, path: str, params: dict[str, str]) -> None:
    response = service.client.get(path, params=params)
    assert response.status_code in (200, 422), (path, params, response.status_code, response.text[:300])


ROUTES = [("/api/v1/targets/prod.llm.good/latency", latency_params),
          ("/api/v1/targets/prod.llm.good/series", series_params),
          ("/targets/prod.llm.good", page_params), ("/targets/stored", page_params), ("/", page_params)]


@pytest.mark.parametrize(("path", "params"), ROUTES, ids=[path for path, _ in ROUTES])
def test_no_parameter_makes_a_500(sourced: Service, path: str, params) -> None:
    @settings(max_examples=150, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture])
    @given(params())
    def check(values: dict[str, str]) -> None:
        _ok_or_4xx(sourced, path, values)

    check()


def test_a_source_targets_odd_ranges_are_read_to_the_millisecond(sourced: Service) -> None:
    """A range whose length is not a whole number of milliseconds (any float pair) is sent to the
    source rounded to the millisecond, and answered; one of decades is refused before anything is
    sent (at most 31 days are read at once)."""
    for start, end in ((1_800_000_000.0001234, 1_800_000_020.0), (1_800_000_000.1, 1_800_000_000.3)):
        response = sourced.client.get("/api/v1/targets/prod.llm.good/latency", params={"start": start, "end": end})
        assert response.status_code == 200, response.text
        assert response.json()["ttft"]["count"] == 50.0
    response = sourced.client.get("/api/v1/targets/prod.llm.good/latency", params={"start": 0.0, "end": 1_796_521_266})
    assert response.status_code == 422
    assert response.json()["detail"][0]["msg"] == ("the range is 1.79652e+09s; at most 2.6784e+06s (31 days) may "
                                                   "be read at once")
