"""The SLOs of the ``slos:`` section as Prometheus rules (part of ``llm-latency rules export``),
laid out like Sloth's output.

Per SLO, one recording rule per window (every alert window and the period)::

    llm_latency_slo:sli_error:ratio_rate<w>{slo="<name>", <target labels>}
      = 1 - sum by (<target labels>) (rate(<histogram>_bucket{le="<threshold>"}[w]))
          / sum by (<target labels>) (rate(<histogram>_count[w]))

over every engine's histogram of the signal (vLLM, SGLang and TGI names, newest first,
joined with ``or`` so a target exporting two names of one family counts once), so the SLI
is per target as in the service (``instance``, or a Prometheus source's ``target_labels``),
and ``llm_latency_slo:error_budget_remaining:ratio`` = 1 - period error ratio / budget. Then
one alert per burn alert (``LLMLatencySLOBurnRate``; labels ``slo``, ``severity``, ``burn``,
``long_window``, ``short_window``; value: the long window's burn rate)::

    llm_latency_slo:sli_error:ratio_rate1h{slo="x"} / 0.01 > 14.4
    and llm_latency_slo:sli_error:ratio_rate5m{slo="x"} / 0.01 > 14.4

The service sums increments between stored snapshots where Prometheus' ``rate`` extrapolates
to the window's edges; good and total are extrapolated alike, so their ratio agrees (a test
compares both on the same samples, tests/slo/test_prometheus_agreement.py).
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from typing import Any

from app.promql.text import format_matchers, instance_regex, le_matcher, num, prom_duration
from app.promsource.queries import HISTOGRAM_FAMILIES, Family
from app.slo import buckets
from app.slo.config import SLO_BURN_ALERT, SloObjective

RATIO = "llm_latency_slo:sli_error:ratio_rate"
BUDGET = "llm_latency_slo:error_budget_remaining:ratio"


def ratio_name(window: float) -> str:
    return f"{RATIO}{prom_duration(window)}"


def _le(family: Family, signal: str, threshold: float) -> str:
    """The bucket's ``le`` as the engine writes it: TGI's geometric bounds are long floats,
    so the configured threshold (e.g. ``2.52512``) is replaced by the bound it matches."""
    bounds = buckets.DEFAULT_BOUNDS.get(family.engine, {}).get(signal, ())
    index = buckets.bound_index(bounds, threshold) if family.engine == "tgi" else None
    return le_matcher(bounds[index] if index is not None else threshold)


def _selector(name: str, matchers: Sequence[str]) -> str:
    inner = ",".join(m for m in matchers if m)
    return f"{name}{{{inner}}}" if inner else name


def slo_matchers(slo: SloObjective, targets: Sequence[Any], scoped: bool) -> list[str]:
    """The label matchers that select the SLO's targets: ``match`` keys as label matchers,
    ``name`` as the instances of those targets of the file (not for a source's replicas)."""
    out = []
    for key, value in sorted(slo.match.items()):
        if key == "name":
            if scoped:
                raise ValueError(f"slos: {slo.name}: match.name names a target of the file; a source's rules group by "
                                 "its target_labels: match on those labels instead")
            chosen = [t for t in targets if t.name == value]
            if not chosen:
                raise ValueError(f"slos: {slo.name}: match.name {value!r} is not a target of the file")
            out.append(f'instance=~"{instance_regex(chosen)}"')
        else:
            out.append(format_matchers([(key, "=", value)]))
    return out


def _labels(slo: str, by: Sequence[str]) -> str:
    """``slo="x",instance="%s"``, escaped for a template string: a printf format for the alert's labels."""
    return ",".join([f'slo=\\"{slo}\\"', *(f'{label}=\\"%s\\"' for label in by)])


def _lookup(query_format: str, by: Sequence[str]) -> str:
    """An annotation that queries Prometheus for another series of the alert's target."""
    values = " ".join(f"$labels.{label}" for label in by)
    return (f'{{{{ with printf "{query_format}" {values} | query }}}}{{{{ . | first | value | printf "%.4g" }}}}'
            "{{ end }}")


def slo_rules(slos: Sequence[SloObjective], targets: Sequence[Any], by: Sequence[str], source_matchers: str,
              runbook: str, scoped: bool = False, fit: Callable[[float], float] = float) -> list[dict[str, Any]]:
    """The recording and alerting rules of every SLO (one group's ``rules``); ``by``: the
    labels of one target, ``source_matchers``: a source's selector (or ""), ``runbook``: the
    burn-rate runbook's link, ``fit``: each window made at least a few scrape intervals long."""
    rules: list[dict[str, Any]] = []
    labels = ", ".join(by)
    for slo in slos:
        matchers = [*slo_matchers(slo, targets, scoped), source_matchers]
        spans = sorted({fit(w) for w in (*slo.windows(), slo.period)})
        for span in spans:
            w = prom_duration(span)
            good, total = [], []
            for family in HISTOGRAM_FAMILIES[slo.signal]:
                own = format_matchers(list(family.matchers))
                bucket = _selector(family.name + "_bucket", [own, _le(family, slo.signal, slo.threshold), *matchers])
                good.append(f"sum by ({labels}) (rate({bucket}[{w}]))")
                total.append(f"sum by ({labels}) (rate({_selector(family.name + '_count', [own, *matchers])}[{w}]))")
            expr = f"1 - (\n  ({' or '.join(good)})\n/\n  ({' or '.join(total)})\n)"
            rules.append({"record": ratio_name(span), "expr": expr, "labels": {"slo": slo.name}})
        budget = num(slo.budget)
        rules.append({"record": BUDGET, "expr": f'1 - {ratio_name(slo.period)}{{slo="{slo.name}"}} / {budget}',
                      "labels": {"slo": slo.name}})
        for alert in slo.burn_alerts:
            long_s, short_s = fit(alert.long), fit(alert.short)
            long_w, short_w = prom_duration(long_s), prom_duration(short_s)
            long_ratio, short_ratio = ratio_name(long_s), ratio_name(short_s)
            who = "/".join(f"{{{{ $labels.{label} }}}}" for label in by)
            rules.append({
                "alert": SLO_BURN_ALERT,
                "expr": (f'{long_ratio}{{slo="{slo.name}"}} / {budget} > {num(alert.factor)}\n'
                         f'and {short_ratio}{{slo="{slo.name}"}} / {budget} > {num(alert.factor)}'),
                "labels": {"slo": slo.name, "severity": slo.severities[alert.kind], "burn": alert.kind,
                           "long_window": long_w, "short_window": short_w},
                "annotations": {
                    "summary": (f"{who}: SLO {slo.name} burns its error budget {{{{ $value | printf \"%.1f\" }}}}x "
                                f"over {long_w} (threshold {num(alert.factor)}x, {alert.kind})"),
                    "description": (f"{num(slo.objective * 100)}% of requests should have {slo.signal} at or under "
                                    f"{num(slo.threshold)}s over {prom_duration(slo.period)}. The error budget burns "
                                    f"{{{{ $value | printf \"%.2f\" }}}}x over {long_w}; the alert fires while it "
                                    f"burns faster than {num(alert.factor)}x over both {long_w} and {short_w}."),
                    "long_burn_rate": '{{ $value | printf "%.4g" }}',
                    "short_burn_rate": _lookup(f"{short_ratio}{{{_labels(slo.name, by)}}} / {budget}", by),
                    "budget_left": _lookup(f"{BUDGET}{{{_labels(slo.name, by)}}}", by),
                    "runbook_url": runbook,
                },
            })
    return rules
