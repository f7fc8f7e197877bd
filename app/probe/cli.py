"""``llm-latency probe``: measure TTFT and ITL from the client side, now.

    llm-latency probe http://10.0.0.5:8000 --model M --prompt-tokens 512 --max-tokens 128 \\
        --concurrency 1,8,32 [--requests N] [--timeout 60s] [--chat] [--api-key-env VAR] [--json]
    llm-latency probe http://10.0.0.5:8000 --prompt-tokens 512,2048,8192 --max-tokens 16

One level per concurrency, or per prompt length (in the order given), the other two factors
fixed: only one factor may vary per sweep. A progress line per level on stderr while it runs, then a
table (or ``--json``) on stdout, with the fitted TTFT-vs-prompt-length slope for a prompt
sweep and the single-vs-load split for a concurrency sweep. The engine's ``/metrics`` page
(``--metrics-url``, default the URL's) is read around every level so the split knows how long
the single request waited in the engine's queue; the table shows that engine view per level
(mean queue time and mean TTFT as the engine measured them). Exits 1 when any request failed, 2 on bad
arguments (click names the option).
"""

from __future__ import annotations

import asyncio
import json
import os
import sys
from collections.abc import Callable
from urllib.parse import urlsplit

import click

from app.core.durations import parse_duration
from app.probe.runner import LevelPlan, ProbeSpec, RequestResult, api_base, run_probe
from app.probe.sweep import analyze, format_analysis, format_table, sweep_plans

MAX_CLI_CONCURRENCY = 1024
MAX_CLI_PROMPT_TOKENS = 1_000_000


class _Duration(click.ParamType):
    name = "duration"

    def convert(self, value, param, ctx):
        if isinstance(value, (int, float)):
            return float(value)
        try:
            seconds = parse_duration(value)
        except ValueError as exc:
            self.fail(str(exc), param, ctx)
        if seconds <= 0:
            self.fail(f"must be positive, got {value!r}", param, ctx)
        return seconds


def _int_list(what: str, low: int, high: int) -> Callable[[click.Context, click.Parameter, str], list[int]]:
    """A click callback for ``512`` or ``1,8,32``: distinct integers in ``[low, high]``."""
    def parse(ctx: click.Context, param: click.Parameter, value: str) -> list[int]:
        try:
            levels = [int(part) for part in str(value).split(",") if part.strip()]
        except ValueError:
            raise click.BadParameter(f"expected integers separated by commas (e.g. 1,8,32), got {value!r}") from None
        if not levels:
            raise click.BadParameter(f"give at least one {what}")
        bad = [c for c in levels if not low <= c <= high]
        if bad:
            raise click.BadParameter(f"{what}s must be between {low} and {high}, got {bad[0]}")
        if len(set(levels)) != len(levels):
            raise click.BadParameter(f"{what}s must be distinct")
        return levels
    return parse


def _progress(plans: list[LevelPlan]) -> Callable[[LevelPlan, RequestResult], None]:
    """Progress on stderr, where it works in a terminal and a log alike: the plan first, then
    one line per finished level (a sweep of long prompts or high concurrency can take minutes)."""
    total = sum(p.requests for p in plans)
    click.echo(f"probing: {len(plans)} level(s), {total} request(s)", err=True)
    finished = [0] * len(plans)
    succeeded = [0] * len(plans)

    def tick(plan: LevelPlan, result: RequestResult) -> None:
        index = plans.index(plan)
        finished[index] += 1
        succeeded[index] += result.ok
        if finished[index] == plan.requests:
            click.echo(f"probing: level {index + 1}/{len(plans)} done (concurrency {plan.concurrency}, "
                       f"prompt {plan.prompt_tokens} tokens): {succeeded[index]}/{plan.requests} ok, "
                       f"{sum(finished)}/{total} requests", err=True)
    return tick


def _url(ctx: click.Context, param: click.Parameter, value: str) -> str:
    parts = urlsplit(value)
    if parts.scheme not in ("http", "https") or not parts.hostname:
        raise click.BadParameter(f"must be an http(s) URL with a host, e.g. http://127.0.0.1:8000, got {value!r}")
    return value


def _optional_url(ctx: click.Context, param: click.Parameter, value: str | None) -> str | None:
    return None if value is None else _url(ctx, param, value)


@click.command("probe")
@click.argument("url", callback=_url)
@click.option("--model", help="Model name; default: the first of GET /v1/models.")
@click.option("--prompt-tokens", default="512", show_default=True,
              callback=_int_list("prompt length", 1, MAX_CLI_PROMPT_TOKENS),
              help="Input length; several (e.g. 512,2048,8192) run the prompt-length ladder at one concurrency "
                   "and fit TTFT vs. prompt length.")
@click.option("--max-tokens", type=click.IntRange(1, 100_000), default=128, show_default=True,
              help="Output length, held fixed (with ignore_eos).")
@click.option("--concurrency", default="1", show_default=True,
              callback=_int_list("concurrency level", 1, MAX_CLI_CONCURRENCY),
              help="Comma-separated levels, e.g. 1,8,32: a single request and the target load, separately "
                   "(at one prompt length).")
@click.option("--requests", type=click.IntRange(1, 100_000), default=None,
              help="Requests per level [default: 2 x the level's concurrency].")
@click.option("--timeout", type=_Duration(), default="120s", show_default=True, help="Per request.")
@click.option("--stall-timeout", type=_Duration(), default="30s", show_default=True,
              help="After the first token: no data for this long = stalled.")
@click.option("--time-limit", type=_Duration(), default=None, help="Stop the whole probe after this long.")
@click.option("--chat", is_flag=True, help="Use /v1/chat/completions (text prompt, calibrated).")
@click.option("--endpoint", help="Path of the completions endpoint, if not the OpenAI default.")
@click.option("--prompt-mode", type=click.Choice(["auto", "token_ids", "text"]), default="auto", show_default=True)
@click.option("--ignore-eos/--no-ignore-eos", default=True, show_default=True,
              help="Ask the engine to ignore end-of-sequence so every answer has --max-tokens tokens.")
@click.option("--api-key-env", metavar="VAR", help="Environment variable holding the API key (Bearer).")
@click.option("--metrics-url", callback=_optional_url,
              help="The engine's Prometheus page, read around every level so a single request's queue wait is "
                   "known [default: URL's /metrics].")
@click.option("--no-metrics", is_flag=True, help="Do not read the engine's /metrics page.")
@click.option("--json", "as_json", is_flag=True, help="Print the result as JSON.")
def probe(url: str, model: str | None, prompt_tokens: list[int], max_tokens: int, concurrency: list[int],
          requests: int | None, timeout: float, stall_timeout: float, time_limit: float | None, chat: bool,
          endpoint: str | None, prompt_mode: str, ignore_eos: bool, api_key_env: str | None,
          metrics_url: str | None, no_metrics: bool, as_json: bool) -> None:
    """Stream requests to URL (an OpenAI-compatible server) and measure TTFT and ITL."""
    api_key = None
    if api_key_env is not None:
        api_key = os.environ.get(api_key_env)
        if not api_key:
            raise click.BadParameter(f"environment variable {api_key_env} is not set", param_hint="'--api-key-env'")
    if endpoint is not None and not endpoint.startswith("/"):
        raise click.BadParameter("must be a path starting with '/'", param_hint="'--endpoint'")
    if chat and prompt_mode == "token_ids":
        raise click.BadParameter("token ids need /v1/completions, not --chat", param_hint="'--prompt-mode'")
    try:
        plans = sweep_plans(prompt_tokens, concurrency, max_tokens, requests)
    except ValueError as exc:
        raise click.BadParameter(str(exc), param_hint="'--prompt-tokens' / '--concurrency'") from None
    if no_metrics:
        metrics_url = None
    elif metrics_url is None:
        metrics_url = api_base(url) + "/metrics"
    spec = ProbeSpec(url=url, model=model, prompt_tokens=max(prompt_tokens), max_tokens=max_tokens,
                     concurrency=max(concurrency), requests=requests, chat=chat, endpoint=endpoint, api_key=api_key,
                     timeout=timeout, stall_timeout=stall_timeout, connect_timeout=min(10.0, timeout),
                     time_limit=time_limit, prompt_mode=prompt_mode, ignore_eos=ignore_eos,  # type: ignore[arg-type]
                     metrics_url=metrics_url)
    result = asyncio.run(run_probe(spec, plans, on_request=_progress(plans)))
    analysis = analyze(result)
    if as_json:
        click.echo(json.dumps({**result.summary(), "analysis": analysis}, indent=2))
    else:
        model_text = result.model or "(server default)"
        click.echo(f"{result.url}{result.endpoint}  model {model_text}  prompt {result.protocol['prompt_mode']}"
                   f"{'' if result.protocol['ignore_eos'] else ', no ignore_eos'}")
        click.echo(format_table(result.levels))
        for problem in sorted({lv.server["error"] for lv in result.levels if lv.server and lv.server["error"]}):
            click.echo(f"engine page ({metrics_url}): {problem}")
        for line in format_analysis(analysis):
            click.echo(line)
    if result.stopped_by == "time_limit":
        click.echo("stopped by --time-limit", err=True)
    if result.failed:
        errors = ", ".join(f"{k}={v}" for k, v in sorted(result.errors.items()))
        click.echo(f"{result.failed} of {result.requests} requests failed: {errors}", err=True)
        sys.exit(1)
    if result.requests == 0:
        click.echo("no request was sent", err=True)
        sys.exit(1)

