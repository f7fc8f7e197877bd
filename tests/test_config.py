"""Config file and settings: a bad config is refused with a message naming the field."""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

import pytest
from click.testing import CliRunner

from app.cli import main
from app.config import MAX_CONFIG_BYTES, ConfigError, load_config
from app.core.durations import format_duration, parse_duration
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
    sample_limit: 80000
    stored_series_limit: 20000
  - name: tgi-b
    url: https://tgi.internal/metrics
    engine: tgi
"""))
    assert [t.name for t in config.targets] == ["vllm-a", "tgi-b"]
    assert config.targets[0].scrape_interval == 15.0
    assert config.targets[0].scrape_timeout == 2.5
    assert config.targets[0].engine == "auto"
    assert config.targets[1].scrape_interval is None
    limits = [(t.sample_limit, t.series_limit, t.stored_series_limit) for t in config.targets]
    assert limits == [(80_000, None, 20_000), (None, None, None)]  # None: the service's defaults


@pytest.mark.parametrize(("body", "message"), [
    ("targets:\n  - name: a\n    url: ftp://x/metrics\n", "targets[0].url: URL scheme must be http or https"),
    ("targets:\n  - name: a\n    url: http://x/m\n    engine: triton\n", "targets[0].engine"),
    ("targets:\n  - name: a\n    url: http://x/m\n    scrape_interval: soon\n",
     "targets[0].scrape_interval: not a duration: 'soon'"),
    ("targets:\n  - name: a\n    url: http://x/m\n    scrape_interval: 5s\n    scrape_timeout: 10s\n",
     "scrape_timeout must not exceed scrape_interval"),
    ("targets:\n  - name: a\n    url: http://x/m\n  - name: a\n    url: http://y/m\n", "duplicate target name 'a'"),
    ("targets:\n  - name: 'bad name!'\n    url: http://x/m\n", "targets[0].name"),
    ("targets:\n  - name: a\n    url: http://x/m\n    labels: {model: x}\n", "label name 'model' is reserved"),
    ("targets:\n  - name: a\n    url: http://x/m\n    colour: red\n",
     "targets[0].colour: Extra inputs are not permitted"),
    ("targets:\n  - name: a\n    url: http://x/m\n    sample_limit: 0\n",
     "targets[0].sample_limit: Input should be greater than 0"),
    ("targets:\n  - name: a\n    url: http://x/m\n    stored_series_limit: 2147483648\n",
     "targets[0].stored_series_limit: Input should be less than or equal to 2147483647"),
    ("targets:\n  - name: a\n    url: http://x/m\n    series_limit: many\n",
     "targets[0].series_limit: Input should be a valid integer"),
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
    canary = write(tmp_path, "targets:\n  - name: a\n    url: http://10.1.2.3:8000/metrics\n"
                             "    canary: {enabled: true, url: 'http://gateway.example.com'}\n")
    with pytest.raises(ConfigError, match=r"targets\[0\].canary.url: host 'gateway.example.com' is not in "):
        load_config(canary, ["10.0.0.0/8"])


def test_check_config_command_exits_non_zero_with_field(tmp_path: Path) -> None:
    path = write(tmp_path, "targets:\n  - name: a\n    url: gopher://x\n")
    result = CliRunner().invoke(main, ["check-config", str(path)])
    assert result.exit_code == 1
    assert result.stderr == f"{path}:3: targets[0].url: URL scheme must be http or https, got 'gopher'\n"
    good = write(tmp_path, "targets:\n  - name: a\n    url: http://x/metrics\n")
    result = CliRunner().invoke(main, ["check-config", str(good)])
    assert (result.exit_code, result.stdout) == (0, f"{good}: OK, 1 target(s), 0 receiver(s)\n")


MANY_PROBLEMS = """\
targets:
  - name: a
    url: gopher://x/metrics
    scrape_interval: 15
    colour: red
  - name: a
    url: http://169.254.169.254/latest
    labels: {model: x}
  - url: http://10.0.0.7/metrics
alerts:
  receivers:
    - name: hook
      url: http://hooks.example.com/x
      timeout: 5
"""


def test_check_config_lists_every_problem_on_its_own_line_with_file_line_and_field(tmp_path: Path) -> None:
    """Structure, durations, URLs and the host allow-list in one pass, in file order: nothing is
    held back until the first batch is fixed."""
    path = write(tmp_path, MANY_PROBLEMS)
    result = CliRunner(env={"LLM_LATENCY_ALLOWED_TARGET_HOSTS": "10.0.0.0/8"}).invoke(
        main, ["check-config", str(path)])
    assert result.exit_code == 1
    assert result.stdout == ""
    assert result.stderr.splitlines() == [f"{path}:{line}" for line in [
        "3: targets[0].url: URL scheme must be http or https, got 'gopher'",
        "4: targets[0].scrape_interval: a duration needs a unit, e.g. 15s",
        "5: targets[0].colour: Extra inputs are not permitted",
        "7: targets[1].url: host '169.254.169.254' is not in allowed_target_hosts",
        "8: targets[1].labels: label name 'model' is reserved",
        "9: targets[2].name: Field required",
        "13: alerts.receivers[0].url: host 'hooks.example.com' is not in allowed_target_hosts",
        "14: alerts.receivers[0].timeout: a duration needs a unit, e.g. 5s",
    ]]


@pytest.mark.parametrize(("body", "line", "message"), [
    (b"targets:\n  - name: caf\xe9\n    url: http://x/metrics\n", 2,
     "not UTF-8 text (byte 0xe9); save the file as UTF-8"),
    (b"[" * 10_000, 1, "nested deeper than 32 levels"),
    (b"targets:\n  - name: a\n    url: http://x/m\n    scrape_interval: 15\n", 4,
     "targets[0].scrape_interval: a duration needs a unit, e.g. 15s"),
    (b"targets:\n  - name: a\n    url: http://x/m\n    scrape_interval: '2.5'\n", 4,
     "targets[0].scrape_interval: a duration needs a unit, e.g. 2.5s"),
    (b"diagnosis:\n  window: 60\n", 2, "diagnosis.window: a duration needs a unit, e.g. 60s"),
    (b"alerts:\n  slos:\n    - {name: t, signal: ttft, threshold: 2}\n", 3,
     "alerts.slos[0].threshold: a duration needs a unit, e.g. 2s"),
    (b"alerts:\n  receivers:\n    - name: r\n      url: gopher://x/\n", 4,
     "alerts.receivers[0].url: URL scheme must be http or https, got 'gopher'"),
    (b"targets:\n  - name: a\n    url: http://x/m\n    canary: {enabled: true, url: 'http:///v1'}\n", 4,
     "targets[0].canary.url: URL has no host"),
    (b"targets:\n  - name: a\n    url: http://x/m\n  - name: a\n    url: http://y/m\n", 1,
     "targets: duplicate target name 'a' (targets[0] and targets[1])"),
    (b"targets: [\n", 2, "not valid YAML: while parsing a flow node did not find expected node content"),
    (b"- just a list\n", 1, "the top level must be a mapping with a 'targets' list"),
])
def test_bad_files_get_one_line_naming_file_line_and_problem(tmp_path: Path, body: bytes, line: int,
                                                              message: str) -> None:
    path = tmp_path / "targets.yaml"
    path.write_bytes(body)
    result = CliRunner().invoke(main, ["check-config", str(path)])
    assert (result.exit_code, result.stderr) == (1, f"{path}:{line}: {message}\n")


@pytest.mark.parametrize("body", [b"", b"# targets come later\n\n", b"---\n"])
def test_an_empty_file_is_refused_and_targets_empty_list_is_how_to_say_none(tmp_path: Path, body: bytes) -> None:
    """The service drops config targets the file no longer names: a truncated file must not
    silently mean "monitor nothing"."""
    path = tmp_path / "targets.yaml"
    path.write_bytes(body)
    result = CliRunner().invoke(main, ["check-config", str(path)])
    assert (result.exit_code, result.stderr) == (1, f"{path}: the file is empty; write 'targets: []' to run with "
                                                    "no targets from the file (targets can still be added through "
                                                    "the API)\n")
    assert len(load_config(write(tmp_path, "targets: []\n")).targets) == 0


def test_oversized_and_unreadable_files_are_refused_before_parsing(tmp_path: Path) -> None:
    big = tmp_path / "big.yaml"
    big.write_bytes(b"# " + b"x" * MAX_CONFIG_BYTES + b"\ntargets: []\n")
    with pytest.raises(ConfigError) as info:
        load_config(big)
    assert str(info.value) == f"{big}: larger than 1 MiB, too large for a targets file"
    just_fits = tmp_path / "fits.yaml"
    just_fits.write_bytes(b"targets: []\n# " + b"x" * (MAX_CONFIG_BYTES - 16) + b"\n")
    assert just_fits.stat().st_size == MAX_CONFIG_BYTES - 1
    assert load_config(just_fits).targets == []
    with pytest.raises(ConfigError) as info:
        load_config(tmp_path)
    assert str(info.value) == f"{tmp_path}: cannot read config file: Is a directory"
    with pytest.raises(ConfigError) as info:
        load_config(tmp_path / "missing.yaml")
    assert str(info.value) == f"{tmp_path / 'missing.yaml'}: cannot read config file: No such file or directory"


def test_config_errors_from_a_real_process_are_single_lines_without_traceback(tmp_path: Path) -> None:
    """The two inputs that used to end in a Python traceback (a decode error, the YAML
    parser's recursion), through the installed entry point in child processes."""
    cases = {"latin1.yaml": (b"targets:\n  - name: a\n    url: http://x/m\n    labels: {team: \xe9quipe}\n",
                             "4: not UTF-8 text (byte 0xe9); save the file as UTF-8"),
             "deep.yaml": (b"targets: " + b"[" * 10_000, "1: nested deeper than 32 levels")}
    runs = {}
    for name, (body, _) in cases.items():
        (tmp_path / name).write_bytes(body)
        command = "check-config" if name == "latin1.yaml" else "serve"
        args = [str(tmp_path / name)] if command == "check-config" else ["--config", str(tmp_path / name)]
        runs[name] = subprocess.Popen([sys.executable, "-m", "app.cli", command, *args], stdout=subprocess.PIPE,
                                      stderr=subprocess.PIPE, text=True,
                                      env={**os.environ, "LLM_LATENCY_DATA_DIR": str(tmp_path / "data")})
    for name, proc in runs.items():
        out, err = proc.communicate(timeout=120)
        assert (proc.returncode, out, err) == (1, "", f"{tmp_path / name}:{cases[name][1]}\n")


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


@pytest.mark.parametrize("blank", ["", "   ", "\t"])
def test_a_blank_token_is_no_token(monkeypatch: pytest.MonkeyPatch, blank: str) -> None:
    """``LLM_LATENCY_API_TOKEN=`` (an unfilled template) neither opens the public listen
    guard nor becomes the token an empty Bearer would match."""
    monkeypatch.setenv("LLM_LATENCY_API_TOKEN", blank)
    settings = Settings()
    assert settings.api_token is None
    with pytest.raises(ValueError, match="refusing to listen on '0.0.0.0' without LLM_LATENCY_API_TOKEN"):
        settings.check_listen_security("0.0.0.0")
    assert Settings(api_token=blank).api_token is None
    assert Settings(api_token=" s3cret ").api_token.get_secret_value() == " s3cret "


def test_durations_outside_the_file_still_take_plain_seconds(monkeypatch: pytest.MonkeyPatch) -> None:
    """Only the config file insists on units; the environment, API bodies and stored rows
    (written back as numbers) keep taking seconds."""
    monkeypatch.setenv("LLM_LATENCY_RETENTION", "3600")
    assert Settings().retention == 3600.0
    from app.config import TargetConfig
    assert TargetConfig.model_validate({"name": "a", "url": "http://x/m", "scrape_interval": 15}).scrape_interval == 15


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
