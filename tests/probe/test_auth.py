"""The optional API key reaches the server as ``Authorization: Bearer <key>`` on every request
(model discovery, preflight, measured requests) from the CLI, an API-started probe and a
canary, checked by a real local server that records the headers and refuses wrong keys;
the key is never stored."""

from __future__ import annotations

from pathlib import Path

from click.testing import CliRunner

from app.probe import repository as probe_repository
from app.probe.canary import CanaryConfig, run_canary
from app.probe.cli import probe
from app.targets import repository as target_repository
from tests.api.conftest import make_service
from tests.probe.servers import FakeOpenAI
from tests.probe.test_api import wait_done


# GET /v1/models, one preflight request, then the measured ones
def expected(key: str | None, measured: int) -> list[tuple[str, str | None]]:
    value = None if key is None else f"Bearer {key}"
    return [("models", value)] + [("completions", value)] * (1 + measured)


def test_the_cli_sends_the_key_from_the_environment(monkeypatch) -> None:
    monkeypatch.setenv("PROBE_AUTH_TEST_KEY", "sk-cli-1234")
    with FakeOpenAI(api_key="sk-cli-1234") as fake:
        ok = CliRunner().invoke(probe, [fake.url("ok"), "--api-key-env", "PROBE_AUTH_TEST_KEY", "--requests", "3",
                                        "--max-tokens", "4", "--no-metrics"])
        sent = list(fake.authorization)
        fake.authorization.clear()
        refused = CliRunner().invoke(probe, [fake.url("ok"), "--requests", "2", "--max-tokens", "4", "--no-metrics"])
        without = list(fake.authorization)
    assert ok.exit_code == 0, ok.output
    assert sent == expected("sk-cli-1234", 3)
    assert "sk-cli-1234" not in ok.stdout + ok.stderr
    # no key: no header at all, and the server's 401 is a recorded error per request
    assert refused.exit_code == 1 and "2 of 2 requests failed: http_status=2" in refused.stderr
    assert without == expected(None, 2)


def test_an_api_probe_sends_its_key_and_never_stores_it(migrated_url: str, tmp_path: Path) -> None:
    with FakeOpenAI(api_key="sk-api-5678") as fake:
        for svc in make_service(migrated_url, tmp_path):
            c = svc.client
            r = c.post("/api/v1/probes", json={"url": fake.url("ok"), "api_key": "sk-api-5678", "requests": 2,
                                               "max_tokens": 4})
            assert r.status_code == 202, r.text
            body = wait_done(c, r.json()["id"])
            full = c.get(f"/api/v1/probes/{body['id']}", params={"requests": True}).json()
            wrong = wait_done(c, c.post("/api/v1/probes", json={"url": fake.url("ok"), "api_key": "sk-other",
                                                                  "requests": 2, "max_tokens": 4}).json()["id"])
            with svc.monitor.sessions() as session:
                stored = [(row.params, row.summary, row.error) for row in probe_repository.list_runs(session)]
    assert body["state"] == "done" and body["summary"]["failed"] == 0 and body["summary"]["requests"] == 2
    assert fake.authorization[:4] == expected("sk-api-5678", 2)
    assert fake.authorization[4:] == expected("sk-other", 2)
    assert wrong["summary"]["errors"] == {"http_status": 2}
    assert all(r["status_code"] == 200 and r["error"] is None for r in full["requests"])
    assert "sk-api-5678" not in str(full) and "sk-api" not in str(stored) and "sk-other" not in str(stored)


def test_a_canary_sends_the_key_named_by_api_key_env(migrated_url: str, tmp_path: Path, monkeypatch) -> None:
    monkeypatch.setenv("PROBE_CANARY_TEST_KEY", "sk-canary-9012")
    with FakeOpenAI(api_key="sk-canary-9012") as fake:
        for svc in make_service(migrated_url, tmp_path):
            assert svc.client.post("/api/v1/targets", json={"name": "f", "url": fake.url("ok") + "/metrics"}
                                   ).status_code == 201
            with svc.monitor.sessions() as session:
                target = target_repository.get_target(session, "f")
            config = CanaryConfig(enabled=True, prompt_tokens=16, max_tokens=4, requests=2,
                                  api_key_env="PROBE_CANARY_TEST_KEY")
            row = run_canary(svc.monitor.sessions, target, config)
    assert row.state == "done" and row.summary["failed"] == 0 and row.summary["requests"] == 2
    assert fake.authorization == expected("sk-canary-9012", 2)
    assert row.params["api_key_env"] == "PROBE_CANARY_TEST_KEY" and "sk-canary" not in str(row.params)
