"""``llm-latency check-config`` on sources: what only the server can tell (its own selector parser,
whether the URL is a Prometheus API at all) against a real Prometheus 2.42 and a local web page
that is not one; an unreachable server and unset credential variables are warnings only."""

from __future__ import annotations

import threading
from collections.abc import Iterator
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path

import pytest
from click.testing import CliRunner, Result

from app.cli import main
from tests.support.prometheus import PrometheusHandle, free_port, running_prometheus


@pytest.fixture(scope="module")
def prometheus(tmp_path_factory: pytest.TempPathFactory) -> Iterator[PrometheusHandle]:
    with running_prometheus(tmp_path_factory.mktemp("prom"), "scrape_configs: []") as prom:
        yield prom


class _WebPage(BaseHTTPRequestHandler):
    """A web application's login page: 200 and HTML for every path and method, as many are."""

    protocol_version = "HTTP/1.1"
    status = 200

    def _answer(self) -> None:
        self.rfile.read(int(self.headers.get("Content-Length") or 0))
        body = b"<!doctype html><html><body>Sign in to secret-dashboard</body></html>"
        self.send_response(self.status)
        self.send_header("Content-Type", "text/html")
        self.send_header("Content-Length", str(len(body)))
        self.end_headers()
        self.wfile.write(body)

    do_GET = do_POST = _answer

    def log_message(self, format: str, *args: object) -> None:
        pass


@pytest.fixture
def web_page() -> Iterator[str]:
    server = ThreadingHTTPServer(("127.0.0.1", 0), _WebPage)
    thread = threading.Thread(target=server.serve_forever, daemon=True)
    thread.start()
    try:
        yield f"http://127.0.0.1:{server.server_address[1]}"
    finally:
        server.shutdown()
        server.server_close()


def check(tmp_path: Path, url: str, selector: str = '{namespace="llm"}', extra: str = "",
          env: dict[str, str] | None = None, *args: str) -> tuple[Path, Result]:
    path = tmp_path / "targets.yaml"
    path.write_text("targets: []\n"
                    "sources:\n"
                    "  - name: prod\n"
                    f"    url: {url}\n"
                    f"    selector: '{selector}'\n"
                    "    target_labels: [namespace, pod]\n" + extra, encoding="utf-8")
    return path, CliRunner(env=env).invoke(main, ["check-config", *args, str(path)])


def test_a_source_the_server_accepts_is_ok(tmp_path: Path, prometheus: PrometheusHandle) -> None:
    path, result = check(tmp_path, prometheus.url, '{namespace="llm", pod=~"vllm-.+"}')
    assert (result.exit_code, result.stderr) == (0, "")
    assert result.stdout == f"{path}: OK, 0 target(s), 1 source(s), 0 receiver(s)\n"


def test_the_servers_parser_rejects_a_selector_the_offline_check_accepts(tmp_path: Path,
                                                                          prometheus: PrometheusHandle) -> None:
    # the offline parser leaves regular expressions to the server (RE2): an unclosed group
    path, result = check(tmp_path, prometheus.url, '{namespace="llm", pod=~"vllm-(0"}')
    assert result.exit_code == 1
    assert result.stderr == (f"{path}:5: sources[0].selector: selector rejected (bad_data): parse error at line 1, "
                             "column 19 by the server's parser\n")
    assert result.stdout == ""
    # offline, the same file passes: the syntax is fine, only the server knows the regex is not
    _, offline = check(tmp_path, prometheus.url, '{namespace="llm", pod=~"vllm-(0"}', "", None, "--offline")
    assert (offline.exit_code, offline.stderr) == (0, "")


def test_a_selector_broken_offline_names_the_field_without_asking(tmp_path: Path) -> None:
    path, result = check(tmp_path, f"http://127.0.0.1:{free_port()}", '{namespace="llm" pod="a"}')
    assert result.exit_code == 1
    assert result.stderr == (f"{path}:5: sources[0].selector: expected ',' or the end at character "
                             "17 of the matchers\n")


def test_a_url_that_is_not_a_prometheus_api_is_an_error(tmp_path: Path, web_page: str) -> None:
    path, result = check(tmp_path, web_page)
    assert result.exit_code == 1
    assert result.stderr == (f"{path}:4: sources[0].url: not a Prometheus API answer: an HTML page; give the "
                             "base URL of a Prometheus HTTP API (it serves /api/v1/query)\n")
    assert "secret-dashboard" not in result.output  # the page's text is never repeated


def test_a_wrong_path_prefix_is_an_error(tmp_path: Path, prometheus: PrometheusHandle) -> None:
    path, result = check(tmp_path, f"{prometheus.url}/prometheus")  # Prometheus serves under /, not /prometheus
    assert result.exit_code == 1
    assert result.stderr == (f"{path}:4: sources[0].url: the API request was refused (HTTP 404 Not Found); give "
                             "the base URL of a Prometheus HTTP API\n")


def test_an_unreachable_server_is_a_warning_and_the_file_is_valid(tmp_path: Path) -> None:
    port = free_port()  # nothing listens there
    path, result = check(tmp_path, f"http://127.0.0.1:{port}")
    assert result.exit_code == 0
    assert result.stderr == (f"{path}:4: warning: sources[0].url: not checked against the server (unreachable: "
                             f"connection refused); valid offline\n")
    assert result.stdout == f"{path}: OK, 0 target(s), 1 source(s), 0 receiver(s)\n"


def test_unset_credential_variables_are_warnings(tmp_path: Path, prometheus: PrometheusHandle) -> None:
    extra = ("    bearer_token_env: CHECK_TEST_PROM_TOKEN\n"
             f"  - name: other\n    url: {prometheus.url}\n    target_labels: [pod]\n"
             "    basic_auth: {username: u, password_env: CHECK_TEST_PROM_PASSWORD}\n")
    env = {"CHECK_TEST_PROM_TOKEN": None, "CHECK_TEST_PROM_PASSWORD": None}
    path, result = check(tmp_path, prometheus.url, '{namespace="llm"}', extra, env)  # type: ignore[arg-type]
    assert result.exit_code == 0
    assert result.stderr.splitlines() == [
        f"{path}:7: warning: sources[0].bearer_token_env: environment variable CHECK_TEST_PROM_TOKEN is not set: "
        "no token would be sent",
        f"{path}:11: warning: sources[1].basic_auth.password_env: environment variable CHECK_TEST_PROM_PASSWORD "
        "is not set: the password would be empty",
    ]
    assert result.stdout == f"{path}: OK, 0 target(s), 2 source(s), 0 receiver(s)\n"
    # set (Prometheus without auth ignores them): no warning, and the secret is never printed
    _, result = check(tmp_path, prometheus.url, '{namespace="llm"}', extra,
                      {"CHECK_TEST_PROM_TOKEN": "s3cr3t-token", "CHECK_TEST_PROM_PASSWORD": "s3cr3t-pw"})
    assert (result.exit_code, result.stderr) == (0, "")
    assert "s3cr3t" not in result.output


@pytest.mark.parametrize(("extra", "line", "message"), [
    ("    pd_pair_labels: [deployment]\n", 3,
     "sources[0]: pd_pair_labels: label 'deployment' is not one of target_labels or service_labels (namespace, pod); "
     "a target keeps only those label values"),
    ("    pd_pair_labels: [pod, namespace]\n", 3,
     "sources[0]: pd_pair_labels: they include every target label, so no two targets share them and no prefill "
     "replica could be paired with a decode replica"),
    ("    pd_pair_labels: [namespace]\n    pd_role_label: namespace\n", 3,
     "sources[0]: pd_role_label 'namespace' cannot be one of pd_pair_labels: a deployment's prefill and decode "
     "replicas differ in it"),
    ("    service_labels: [role]\n    pd_pair_labels: [namespace]\n    pd_role_label: role\n", None, None),
])
def test_pd_pairing_labels_are_checked_offline(tmp_path: Path, extra: str, line: int | None,
                                               message: str | None) -> None:
    path, result = check(tmp_path, f"http://127.0.0.1:{free_port()}", extra=extra)
    if message is None:
        assert result.exit_code == 0, result.stderr
        return
    assert result.exit_code == 1
    assert result.stderr == f"{path}:{line}: {message}\n"
