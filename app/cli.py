"""The ``llm-latency`` command."""

from __future__ import annotations

import contextlib
import logging
import socket
import sys
from collections.abc import Callable, Iterator
from pathlib import Path

import click
import yaml
from pydantic import ValidationError

from app.config import ConfigError, FileConfig, load_config
from app.core.durations import parse_duration
from app.core.thresholds import Thresholds
from app.core.validation import format_validation_error
from app.emulator.cli import emulate
from app.probe.cli import probe
from app.rules_export import rules
from app.settings import Settings


def load_settings(**overrides: object) -> Settings:
    """Settings from the environment, with command-line overrides; a bad value exits
    with a message naming the setting."""
    try:
        return Settings(**{k: v for k, v in overrides.items() if v is not None})
    except ValidationError as exc:
        raise click.ClickException(f"invalid settings: {format_validation_error(exc)}") from None


@click.group()
@click.version_option(package_name="llm-latency-monitor", prog_name="llm-latency", message="%(prog)s %(version)s")
@click.option("--log-level", default="info", show_default=True,
              type=click.Choice(["debug", "info", "warning", "error"], case_sensitive=False))
def main(log_level: str) -> None:
    """LLM Latency Monitor: TTFT/ITL percentiles and why LLM serving is slow."""
    logging.basicConfig(level=log_level.upper(), format="%(asctime)s %(levelname)s %(name)s: %(message)s")
    if log_level.lower() != "debug":
        # one line per job run, per migration step and per HTTP request (probes, receivers) is
        # noise at info level
        for noisy in ("apscheduler", "alembic", "httpx", "httpcore"):
            logging.getLogger(noisy).setLevel(logging.WARNING)


def config_or_exit(path: Path, allowed_hosts: list[str]) -> FileConfig:
    """The targets file, or exit 1 with its problems on stderr, one per line."""
    try:
        return load_config(path, allowed_hosts)
    except ConfigError as exc:
        for problem in exc.problems:
            click.echo(problem, err=True)
        sys.exit(1)


def bind_listener(settings: Settings, host: str, port: int) -> socket.socket:
    """The listening socket, bound before anything else starts, so a busy port fails at once
    with one line naming it (and nothing claims the service runs)."""
    try:
        settings.check_listen_security(host)
    except ValueError as exc:
        raise click.ClickException(str(exc)) from None
    sock = socket.socket(socket.AF_INET6 if ":" in host else socket.AF_INET, socket.SOCK_STREAM)
    sock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
    try:
        sock.bind((host.strip("[]"), port))
    except OSError as exc:
        sock.close()
        raise click.ClickException(f"cannot listen on {host}:{port}: {exc.strerror or exc}") from None
    return sock


def run_server(settings: Settings, sock: socket.socket, banner: str) -> None:
    """Serve on ``sock`` until stopped; ``banner`` is printed once the service has started
    (database ready, targets loaded) and accepts connections, never before."""
    import uvicorn

    from app.main import create_app

    class Server(uvicorn.Server):
        async def startup(self, sockets: list[socket.socket] | None = None) -> None:
            await super().startup(sockets=sockets)
            if self.started:
                click.echo(banner)

    try:
        app = create_app(settings)
        # the start-up does this too, but a failure there is a traceback from the server's
        # lifespan: here it is one line naming the database
        with database_errors(settings.effective_database_url):
            try:
                app.state.monitor.prepare_database()
            except RuntimeError as exc:  # a PostgreSQL schema behind the code: `llm-latency db upgrade`
                raise click.ClickException(str(exc)) from None
        server = Server(uvicorn.Config(app, log_level="warning"))
        server.run(sockets=[sock])
    except KeyboardInterrupt:  # uvicorn re-raises the Ctrl-C it handled: a clean stop
        return
    finally:
        sock.close()
    if not server.started:
        raise click.ClickException("the service did not start (see the error above)")


@main.command()
@click.option("--config", "config_file", type=click.Path(path_type=Path), help="YAML file with targets.")
@click.option("--host", help="Listen address (default LLM_LATENCY_HOST or 127.0.0.1).")
@click.option("--port", type=int, help="Listen port (default LLM_LATENCY_PORT or 8000).")
def serve(config_file: Path | None, host: str | None, port: int | None) -> None:
    """Run the service: scrape the configured targets, store, serve the API."""
    settings = load_settings(config_file=config_file, host=host, port=port)
    if settings.config_file is not None:
        config_or_exit(settings.config_file, settings.allowed_target_hosts)
    sock = bind_listener(settings, settings.host, settings.port)
    bound_port = sock.getsockname()[1]
    run_server(settings, sock, f"LLM Latency Monitor on http://{settings.host}:{bound_port}  (API docs: /docs)")


@main.command("check-config")
@click.argument("config_file", type=click.Path(path_type=Path))
@click.option("--offline", is_flag=True, help="Ask no server: neither the sources' nor the targets' (syntax "
                                               "checks only).")
def check_config(config_file: Path, offline: bool) -> None:
    """Validate a targets file; exit 1 listing every problem on stderr, one per line
    (``file:line: field.path: reason``).

    Discovery files are read as the service would read them. Each Prometheus source's
    server, when it answers, checks that its URL is a Prometheus HTTP API and parses its
    selector; an unreachable server and unset credential variables are warnings
    (``file:line: warning: field.path: reason``), not errors. Each target (the file's and the
    discovery files') is scraped once: a URL that answers trtllm-serve's JSON ``/metrics`` is an
    error naming the page to scrape, one that cannot be scraped now a warning.
    """
    from app.config import field_line
    from app.diagnosis.sampling import window_warning
    from app.promsource.check import check_source, missing_credentials, window_problems
    from app.promsource.config import PrometheusSourceConfig
    from app.promsource.intervals import configured
    from app.scrape.check import TargetToCheck, check_targets
    from app.scrape.discovery import check_discovery

    settings = load_settings()
    allowed_hosts = settings.allowed_target_hosts
    config = config_or_exit(config_file, allowed_hosts)
    discovered, sd_problems = check_discovery(config, config_file.parent, allowed_hosts)
    for sd_problem in sd_problems:
        click.echo(sd_problem, err=True)
    diagnosis = config.diagnosis

    def window_check(source: PrometheusSourceConfig) -> Callable[[float], str | None]:
        return lambda interval: window_warning(source.fitted_window(diagnosis.window, interval), interval,
                                               diagnosis.thresholds)

    problems = [p for index, source in enumerate(config.sources)
                for p in ([*missing_credentials(source, index),
                           *(window_problems(source, index, configured(source.scrape_interval), window_check(source))
                             if source.scrape_interval is not None else [])]
                          if offline else check_source(source, index, window_check=window_check(source)))]
    for problem in problems:
        kind = "" if problem.error else "warning: "
        click.echo(f"{config_file}:{field_line(config_file, problem.loc)}: {kind}{problem.field}: {problem.message}",
                   err=True)
    for index, target in enumerate(config.targets):  # the file's targets, at their scrape interval
        interval = target.scrape_interval or settings.default_scrape_interval
        warning = window_warning(diagnosis.window, interval, diagnosis.thresholds)
        if warning is not None and target.scrape_interval:
            loc: tuple = ("targets", index, "scrape_interval")
            click.echo(f"{config_file}:{field_line(config_file, loc)}: warning: targets[{index}].scrape_interval: "
                       f"{warning}", err=True)
        elif warning is not None:  # the settings' default interval
            loc = ("diagnosis", "window")
            click.echo(f"{config_file}:{field_line(config_file, loc)}: warning: diagnosis.window: targets[{index}] "
                       f"({target.name}) is {warning}", err=True)
    target_errors = False
    if not offline and not sd_problems:
        timeout = settings.default_scrape_timeout
        asked = [TargetToCheck(f"targets[{i}].url", t.url, ("targets", i, "url"), t.engine,
                               t.scrape_timeout or timeout) for i, t in enumerate(config.targets)]
        asked += [TargetToCheck(f"{item.origin} target {item.address}", item.url, timeout=timeout)
                  for item in discovered]
        for target_problem in check_targets(asked, settings.max_page_bytes):
            kind = "" if target_problem.error else "warning: "
            t = target_problem.target
            where = f"{config_file}:{field_line(config_file, t.loc)}" if t.loc else str(config_file)
            click.echo(f"{where}: {kind}{t.field}: {target_problem.message}", err=True)
            target_errors = target_errors or target_problem.error
    if sd_problems or target_errors or any(p.error for p in problems):
        sys.exit(1)
    sd = len(config.file_sd_configs) + len(config.http_sd_configs)
    sources = f", {len(config.sources)} source(s)" if config.sources else ""
    receivers = len(config.alerts.receivers)
    click.echo(f"{config_file}: OK, {len(config.targets)} target(s){sources}, {receivers} receiver(s)"
               + (f", {sd} discovery config(s) ({len(discovered)} target(s) in the files now)" if sd else ""))


@main.group()
def db() -> None:
    """Database schema migrations (Alembic)."""


@contextlib.contextmanager
def database_errors(url: str) -> Iterator[None]:
    """A database that cannot be reached (or refuses a statement) is one line naming it,
    password hidden, and exit 1; not a driver traceback."""
    from sqlalchemy.engine import make_url
    from sqlalchemy.exc import ArgumentError, SQLAlchemyError

    try:
        yield
    except SQLAlchemyError as exc:
        reason = " ".join(str(getattr(exc, "orig", None) or exc).split("\n")[0].split())
        try:
            shown = make_url(url).render_as_string(hide_password=True)
        except ArgumentError:  # the reason already says what is wrong with it
            shown = "(unparsable URL)"
        raise click.ClickException(f"database {shown}: {reason}") from None


@db.command("upgrade")
@click.option("--revision", default="head", show_default=True)
def db_upgrade(revision: str) -> None:
    """Create or upgrade the schema of LLM_LATENCY_DATABASE_URL."""
    from app.store.db import upgrade

    url = load_settings().effective_database_url
    with database_errors(url):
        upgrade(url, revision)
    click.echo(f"database at revision {revision}")


@db.command("downgrade")
@click.argument("revision")
def db_downgrade(revision: str) -> None:
    """Downgrade the schema to REVISION ('base' drops everything)."""
    from app.store.db import downgrade

    url = load_settings().effective_database_url
    with database_errors(url):
        downgrade(url, revision)
    click.echo(f"database at revision {revision}")


@db.command("current")
def db_current() -> None:
    """Print the schema revision of the database."""
    from app.store.db import current_revision, head_revision, make_engine

    url = load_settings().effective_database_url
    with database_errors(url):
        engine = make_engine(url)
        try:
            click.echo(f"current: {current_revision(engine) or 'none'}  head: {head_revision()}")
        finally:
            engine.dispose()


@main.command()
@click.argument("url")
@click.option("--window", default="60s", show_default=True, help="How long to watch the engine.")
@click.option("--baseline", help="Watch this long first, then the window, and say what changed between the two "
                                 "(e.g. 60s).")
@click.option("--interval", default="5s", show_default=True, help="Scrape interval inside the window.")
@click.option("--engine", type=click.Choice(["auto", "vllm", "tgi", "sglang", "trtllm"]), default="auto",
              show_default=True)
@click.option("--gpu", help="GPU preset for the decode floor, e.g. A100-80G, H100-SXM, L40S.")
@click.option("--hbm-bandwidth", type=float, help="HBM bandwidth in bytes/s (instead of --gpu).")
@click.option("--model", "model_preset", help="Model preset, e.g. llama-3.1-8b.")
@click.option("--params", type=float, help="Parameter count (instead of --model), e.g. 8e9.")
@click.option("--weight-dtype", default="bf16", show_default=True)
@click.option("--tp", "tensor_parallel", default=1, show_default=True, help="Tensor-parallel GPUs.")
@click.option("--threshold", "threshold_options", multiple=True, metavar="NAME=VALUE",
              help="A diagnosis threshold (app/core/thresholds.py), e.g. expected_ttft_seconds=60; repeatable.")
@click.option("--json", "as_json", is_flag=True, help="Machine-readable output.")
def diagnose(url: str, window: str, baseline: str | None, interval: str, engine: str, gpu: str | None,
             hbm_bandwidth: float | None, model_preset: str | None, params: float | None, weight_dtype: str,
             tensor_parallel: int, threshold_options: tuple[str, ...], as_json: bool) -> None:
    """Watch a live engine's /metrics for a window and say why it is slow; with --baseline, watch
    that long first and say what changed between the two (docs/changes.md).

    Exit status: 0 healthy (every regime judged, none found, latency in its expected range),
    1 a regime was found (``unexplained`` too: latency out of range and no rule explains it),
    2 bad arguments, 3 the URL could not be scraped or serves no engine metrics, 4 not enough
    traffic to judge, 5 not judged: nothing found but some regime could not be judged (the
    engine does not export what its rule reads; the output lists them under "not judged").
    """
    import json

    from app.core.urls import validate_target_url
    from app.diagnosis import oneshot
    from app.diagnosis.profile import HardwareProfile

    try:
        validate_target_url(url, [])
        window_s, interval_s = parse_duration(window), parse_duration(interval)
        baseline_s = parse_duration(baseline) if baseline is not None else None
    except ValueError as exc:
        raise click.BadParameter(str(exc)) from None
    if window_s < interval_s or interval_s <= 0:
        raise click.BadParameter(f"--window ({window}) must be at least one --interval ({interval})")
    if baseline_s is not None and baseline_s < 3 * interval_s:
        raise click.BadParameter(f"--baseline ({baseline}) must be at least three --interval ({interval}): its "
                                 "parts give the noise", param_hint="'--baseline'")
    hardware = None
    if gpu or hbm_bandwidth or model_preset or params:
        try:
            hardware = HardwareProfile(gpu=gpu, hbm_bandwidth=hbm_bandwidth, model=model_preset, params=params,
                                       weight_dtype=weight_dtype, tensor_parallel=tensor_parallel)
        except ValidationError as exc:
            raise click.BadParameter(format_validation_error(exc), param_hint="hardware options") from None
    thresholds = parse_thresholds(threshold_options)
    if not as_json:
        click.echo(f"watching {url} for {window_s + (baseline_s or 0.0):g} s ...", err=True)
    result = oneshot.run(url, window_s, interval_s, engine, timeout=min(10.0, interval_s), hardware=hardware,
                         thresholds=thresholds, baseline=baseline_s)
    click.echo(json.dumps(result.to_dict(), indent=2, default=str) if as_json
               else oneshot.format_text(result, runbook_base=load_settings().public_url))
    sys.exit(result.exit_code)


def parse_thresholds(options: tuple[str, ...]) -> Thresholds:
    """``--threshold NAME=VALUE`` options as :class:`Thresholds`; a bad one is a usage error naming it."""
    values: dict[str, str] = {}
    for option in options:
        name, sep, value = option.partition("=")
        if not sep or not name.strip():
            raise click.BadParameter(f"{option!r}: expected NAME=VALUE", param_hint="'--threshold'")
        values[name.strip()] = value.strip()
    try:
        return Thresholds.model_validate(values)
    except ValidationError as exc:
        raise click.BadParameter(format_validation_error(exc), param_hint="'--threshold'") from None


DEMO_TARGETS = (
    # name, scenario, engine
    ("vllm-healthy", "healthy", "vllm"),
    ("vllm-queueing", "queueing", "vllm"),
    ("vllm-interference", "prefill_interference", "vllm"),
    ("vllm-kv-pressure", "kv_cache_pressure", "vllm"),
    ("tgi-bandwidth", "bandwidth_bound", "tgi"),
    ("vllm-long-prompts", "prefill_compute", "vllm-legacy"),
)


@main.command()
@click.option("--port", default=8000, show_default=True, help="Port of the monitor's API.")
@click.option("--time-scale", default=1.0, show_default=True, help="Emulator clock speed-up.")
@click.option("--data-dir", type=click.Path(path_type=Path), default=Path("data/demo"), show_default=True)
@click.option("--scrape-interval", default="5s", show_default=True)
@click.option("--engine-port-base", type=click.IntRange(1, 65535 - len(DEMO_TARGETS) + 1),
              help=f"Serve the {len(DEMO_TARGETS)} emulated engines on this port and the next "
                   f"{len(DEMO_TARGETS) - 1} (default: free ports the system picks).")
def demo(port: int, time_scale: float, data_dir: Path, scrape_interval: str, engine_port_base: int | None) -> None:
    """Emulated vLLM and TGI engines in different regimes + the monitor, on this machine.

    No GPU and no external services: the engines are the built-in emulator, storage is
    SQLite under --data-dir (recreated each run). Runs until Ctrl-C.
    """
    from app.emulator.server import EmulatorFleet, TargetSpec

    try:
        interval = parse_duration(scrape_interval)
    except ValueError as exc:
        raise click.BadParameter(str(exc), param_hint="'--scrape-interval'") from None
    settings = load_settings(host="127.0.0.1", port=port)
    sock = bind_listener(settings, "127.0.0.1", port)  # a busy port fails before the engines start
    port = sock.getsockname()[1]
    data_dir.mkdir(parents=True, exist_ok=True)
    for leftover in data_dir.glob("llm-latency.db*"):
        leftover.unlink()
    fleet = EmulatorFleet([TargetSpec(name=name, scenario=scenario, engine=engine, seed=i, time_scale=time_scale,
                                      port=0 if engine_port_base is None else engine_port_base + i)
                           for i, (name, scenario, engine) in enumerate(DEMO_TARGETS)])
    try:
        try:
            fleet.start()
        except OSError as exc:  # a pinned engine port that is taken
            raise click.ClickException(f"cannot serve the emulated engines on ports {engine_port_base}–"
                                       f"{(engine_port_base or 0) + len(DEMO_TARGETS) - 1}: "
                                       f"{exc.strerror or exc}") from None
        config = {"targets": [{"name": name, "url": f"{fleet.urls[name]}/metrics",
                               "scrape_interval": f"{interval:g}s"} for name, _, _ in DEMO_TARGETS]}
        config_path = data_dir / "demo-targets.yaml"
        config_path.write_text(yaml.safe_dump(config, sort_keys=False), encoding="utf-8")
        settings = load_settings(data_dir=data_dir, config_file=config_path, port=port, host="127.0.0.1",
                                 default_scrape_interval=interval, default_scrape_timeout=min(10.0, 0.8 * interval),
                                 latency_window="2m",
                                 summary_interval=scrape_interval)
        engines = [f"  {name:<20} {engine:<12} {scenario:<22} {fleet.urls[name]}/metrics"
                   for name, scenario, engine in DEMO_TARGETS]
        base = f"http://127.0.0.1:{port}"
        run_server(settings, sock, "\n".join([
            "Emulated engines:", *engines,
            f"\nLLM Latency Monitor: {base}\n  status page: {base}/\n  API docs:   {base}/docs\n"
            f"  latency:    {base}/api/v1/targets/vllm-queueing/latency?window=1m\n"
            f"  self metrics: {base}/metrics\nCtrl-C to stop."]))
    finally:
        sock.close()
        fleet.stop()


main.add_command(emulate)
main.add_command(rules)
main.add_command(probe)

if __name__ == "__main__":  # pragma: no cover
    sys.exit(main())
