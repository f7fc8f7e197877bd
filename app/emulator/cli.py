"""``llm-latency emulate``: serve emulated vLLM, TGI, SGLang and TensorRT-LLM (trtllm-serve) engines until Ctrl-C.

Examples::

    llm-latency emulate --scenario healthy --scenario queueing
    llm-latency emulate --target api=healthy->queueing@60:vllm@8001 --target old=kv_cache_pressure:vllm-legacy
    llm-latency emulate --list-scenarios
"""

from __future__ import annotations

import re
import signal
import threading

import click

from app.emulator import scenarios
from app.emulator.exposition import ENGINES
from app.emulator.server import EmulatorFleet, TargetSpec

_TARGET = re.compile(r"^(?P<name>[A-Za-z0-9_.-]+)=(?P<rest>.+)$")


def parse_target(text: str, *, default_engine: str = "vllm") -> tuple[str, str, str, int | None]:
    """``name=scenario[:engine][@port]`` -> (name, scenario, engine, port or None).

    The scenario may be a transition chain (``healthy->queueing@60``): an ``@N`` right after
    a ``->NAME`` is that phase's start time, an extra trailing ``@N`` is the port.
    """
    m = _TARGET.match(text.strip())
    if not m:
        raise ValueError(f"bad --target {text!r}: expected name=scenario[:engine][@port]")
    name, rest = m["name"], m["rest"]
    engine, port = default_engine, None
    if ":" in rest:
        rest, eng = rest.rsplit(":", 1)
        if "@" in eng:
            eng, p = eng.split("@", 1)
            port = _port(p, text)
        engine = eng
    else:
        parts = rest.split("->")
        last = parts[-1]
        ats = last.split("@")
        if len(parts) == 1 and len(ats) == 2:  # "healthy@8001"
            rest, port = ats[0], _port(ats[1], text)
        elif len(parts) > 1 and len(ats) == 3:  # "a->b@60@8001"
            rest, port = "->".join(parts[:-1] + ["@".join(ats[:2])]), _port(ats[2], text)
    if engine not in ENGINES:
        raise ValueError(f"bad --target {text!r}: unknown engine {engine!r}; valid: {', '.join(ENGINES)}")
    return name, rest, engine, port


def _port(p: str, text: str) -> int:
    if not p.isdigit() or not 0 <= int(p) <= 65535:
        raise ValueError(f"bad --target {text!r}: port {p!r} is not a number in 0-65535")
    return int(p)


def build_specs(scenario_names: tuple[str, ...], targets: tuple[str, ...], *, engine: str, port: int, seed: int,
                time_scale: float, model_name: str | None, host: str, warmup: float) -> list[TargetSpec]:
    specs: list[TargetSpec] = []
    next_port = port

    def take_port(explicit: int | None) -> int:
        nonlocal next_port
        if explicit is not None:
            return explicit
        if port == 0:
            return 0
        p = next_port
        next_port += 1
        return p

    used: set[str] = set()
    for i, sc in enumerate(scenario_names):
        name = re.sub(r"[^A-Za-z0-9_.-]+", "_", sc)
        if name in used:
            name = f"{name}-{i}"
        used.add(name)
        specs.append(TargetSpec(name, sc, engine=engine, port=take_port(None), seed=seed + i, model_name=model_name,
                                time_scale=time_scale, host=host, warmup_s=warmup))
    for j, t in enumerate(targets):
        name, sc, eng, p = parse_target(t, default_engine=engine)
        if name in used:
            raise ValueError(f"duplicate target name {name!r}")
        used.add(name)
        specs.append(TargetSpec(name, sc, engine=eng, port=take_port(p), seed=seed + len(scenario_names) + j,
                                model_name=model_name, time_scale=time_scale, host=host, warmup_s=warmup))
    for s in specs:
        s.validate()
    return specs


@click.command("emulate")
@click.option("--scenario", "scenario_names", multiple=True, metavar="NAME",
              help="Serve one target per scenario (repeatable). A transition chain works too: healthy->queueing@60.")
@click.option("--target", "targets", multiple=True, metavar="NAME=SCENARIO[:ENGINE][@PORT]",
              help="Serve a named target (repeatable).")
@click.option("--engine", type=click.Choice(ENGINES), default="vllm", show_default=True,
              help="Metrics format for --scenario targets (and --target without :ENGINE).")
@click.option("--port", type=click.IntRange(0, 65535), default=0, show_default=True,
              help="First port; further targets take the next ones. 0 = pick free ports.")
@click.option("--host", default="127.0.0.1", show_default=True, help="Listen address.")
@click.option("--seed", type=int, default=0, show_default=True, help="Random seed (target i uses seed + i).")
@click.option("--time-scale", type=click.FloatRange(min=0.01, max=1000.0), default=1.0, show_default=True,
              help="Simulated seconds per wall second; histograms record simulated seconds.")
@click.option("--warmup", type=click.FloatRange(min=0.0), default=0.0, show_default=True,
              help="Simulated seconds to run before serving, so pages start with data.")
@click.option("--model-name", default=None, help="Served model name (default: the scenario's).")
@click.option("--list-scenarios", is_flag=True, help="List the scenarios and their signatures, then exit.")
def emulate(scenario_names, targets, engine, port, host, seed, time_scale, warmup, model_name, list_scenarios) -> None:
    """Serve emulated vLLM/TGI/SGLang/TensorRT-LLM engines (real-format /metrics and OpenAI streaming) until Ctrl-C."""
    if list_scenarios:
        for s in scenarios.describe_all():
            click.echo(f"{s['name']:<22} [{s['regime'] or 'healthy'}] {s['summary']}")
            click.echo(f"    {s['description']}")
        return
    if not scenario_names and not targets:
        raise click.UsageError("give at least one --scenario or --target (see --list-scenarios)")
    try:
        specs = build_specs(scenario_names, targets, engine=engine, port=port, seed=seed, time_scale=time_scale,
                            model_name=model_name, host=host, warmup=warmup)
    except ValueError as exc:
        raise click.BadParameter(str(exc)) from None
    fleet = EmulatorFleet(specs)
    try:
        fleet.start()
    except OSError as exc:
        raise click.ClickException(f"cannot listen: {exc}") from None
    stop = threading.Event()

    def on_signal(signum, frame) -> None:
        stop.set()

    old = {s: signal.signal(s, on_signal) for s in (signal.SIGINT, signal.SIGTERM)}
    try:
        for spec in specs:
            click.echo(f"{spec.name:<20} {spec.engine:<12} {spec.scenario:<28} {fleet.urls[spec.name]}/metrics")
        click.echo(f"time scale {time_scale:g} (histograms in simulated seconds); Ctrl-C to stop")
        while not stop.wait(0.5):
            pass
    finally:
        fleet.stop()
        for s, h in old.items():
            signal.signal(s, h)
    click.echo("stopped")


if __name__ == "__main__":  # python -m app.emulator.cli ...
    emulate()
