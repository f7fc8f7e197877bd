"""Config file and settings: a bad config is refused with a message naming the field."""

from __future__ import annotations

from pathlib import Path

import pytest
from click.testing import CliRunner

from app.cli import main
from app.config import ConfigError, load_config
from app.durations import format_duration, parse_duration
from app.settings import Settings


def write(tmp_path: Path, text: str) -> Path:
    path = tmp_path / "targets.yaml"
    path.write_text(text, encoding="utf-8")
    return path


def test_valid_config_loads_with_durations_and_defaults(tmp_path: Path) -> None:
    config = load_config(write(tmp_path, """
targets:
  - name: vllm-a
    url: http://10.0.0.5:8000/metrics
    labels: {cluster: prod}
    scrape_interval: 15s
    scrape_timeout: 2500ms
  - name: tgi-b
    url: https://tgi.internal/metrics
    engine: tgi
"""))
    assert [t.name for t in config.targets] == ["vllm-a", "tgi-b"]
    assert config.targets[0].scrape_interval == 15.0
    assert config.targets[0].scrape_timeout == 2.5
    assert config.targets[0].engine == "auto"
    assert config.targets[1].scrape_interval is None


@pytest.mark.parametrize(("body", "message"), [
    ("targets:\n  - name: a\n    url: ftp://x/metrics\n", "targets[0].url: URL scheme must be http or https"),
    ("targets:\n  - name: a\n    url: http://x/m\n    engine: triton\n", "targets[0].engine"),
    ("targets:\n  - name: a\n    url: http://x/m\n    scrape_interval: soon\n", "targets[0].scrape_interval: not a duration: 'soon'"),
    ("targets:\n  - name: a\n    url: http://x/m\n    scrape_interval: 5s\n    scrape_timeout: 10s\n",
     "scrape_timeout must not exceed scrape_interval"),
    ("targets:\n  - name: a\n    url: http://x/m\n  - name: a\n    url: http://y/m\n", "duplicate target name 'a'"),
    ("targets:\n  - name: 'bad name!'\n    url: http://x/m\n", "targets[0].name"),
    ("targets:\n  - name: a\n    url: http://x/m\n    labels: {model: x}\n", "label name 'model' is reserved"),
    ("targets:\n  - name: a\n    url: http://x/m\n    colour: red\n", "targets[0].colour: Extra inputs are not permitted"),
    ("targets: [\n", "not valid YAML"),
    ("- just a list\n", "top level must be a mapping"),
])
def test_bad_config_is_refused_naming_the_field(tmp_path: Path, body: str, message: str) -> None:
    with pytest.raises(ConfigError) as info:
        load_config(write(tmp_path, body))
    assert message in str(info.value)


def test_host_allow_list_restricts_target_urls(tmp_path: Path) -> None:
    path = write(tmp_path, "targets:\n  - name: a\n    url: http://169.254.169.254/latest\n")
    with pytest.raises(ConfigError, match=r"targets\[0\].url: host '169.254.169.254' is not in allowed_target_hosts"):
        load_config(path, ["10.0.0.0/8", "*.svc.cluster.local"])
    ok = write(tmp_path, "targets:\n  - name: a\n    url: http://10.1.2.3:8000/metrics\n"
                         "  - name: b\n    url: http://vllm.ml.svc.cluster.local/metrics\n")
    assert len(load_config(ok, ["10.0.0.0/8", "*.svc.cluster.local"]).targets) == 2


def test_check_config_command_exits_non_zero_with_field(tmp_path: Path) -> None:
    path = write(tmp_path, "targets:\n  - name: a\n    url: gopher://x\n")
    result = CliRunner().invoke(main, ["check-config", str(path)])
    assert result.exit_code == 1
    assert "targets[0].url: URL scheme must be http or https, got 'gopher'" in result.output
    good = write(tmp_path, "targets:\n  - name: a\n    url: http://x/metrics\n")
    result = CliRunner().invoke(main, ["check-config", str(good)])
    assert result.exit_code == 0 and "OK, 1 target(s)" in result.output


def test_settings_from_environment(monkeypatch: pytest.MonkeyPatch, tmp_path: Path) -> None:
    monkeypatch.setenv("LLM_LATENCY_DATA_DIR", str(tmp_path))
    monkeypatch.setenv("LLM_LATENCY_RETENTION", "2d")
    monkeypatch.setenv("LLM_LATENCY_ALLOWED_TARGET_HOSTS", "10.0.0.0/8, *.internal")
    settings = Settings()
    assert settings.retention == 172800.0
    assert settings.allowed_target_hosts == ["10.0.0.0/8", "*.internal"]
    assert settings.effective_database_url == f"sqlite:///{tmp_path.as_posix()}/llm-latency.db"


def test_bad_setting_names_the_variable(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("LLM_LATENCY_RETENTION", "forever")
    result = CliRunner().invoke(main, ["db", "current"])
    assert result.exit_code == 1
    assert "invalid settings: retention: not a duration: 'forever'" in result.output


def test_listening_beyond_loopback_needs_a_token() -> None:
    Settings().check_listen_security("127.0.0.1")
    Settings().check_listen_security("::1")
    with pytest.raises(ValueError, match="refusing to listen on '0.0.0.0' without LLM_LATENCY_API_TOKEN"):
        Settings().check_listen_security("0.0.0.0")
    Settings(api_token="s3cret").check_listen_security("0.0.0.0")
    Settings(allow_unauthenticated_public=True).check_listen_security("0.0.0.0")


@pytest.mark.parametrize(("text", "seconds"), [("15s", 15), ("5m", 300), ("1h30m", 5400), ("7d", 604800),
                                               ("250ms", 0.25), ("90", 90), (2.5, 2.5)])
def test_durations(text: str, seconds: float) -> None:
    assert parse_duration(text) == seconds


@pytest.mark.parametrize("text", ["", "5 m", "m5", "-1s", "1x", "nan"])
def test_bad_durations(text: str) -> None:
    with pytest.raises(ValueError):
        parse_duration(text)


def test_format_duration() -> None:
    assert [format_duration(s) for s in (300, 3600, 86400, 45, 0.5)] == ["5m", "1h", "1d", "45s", "0.5s"]
