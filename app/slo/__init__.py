"""Latency SLOs: objectives on the engines' histograms, their error budgets and burn-rate alerts.

* :mod:`app.slo.config` - the ``slos:`` section of the targets YAML (``SloObjective``);
* :mod:`app.slo.buckets` - the engines' default bucket layouts, for the threshold check;
* :mod:`app.slo.record` - the recording round: good/total increments per SLO, target and round;
* :mod:`app.slo.status` - ``SloStatus``, the one computation the API, ``/metrics`` and the
  burn-rate alerts share (``slo_statuses``).
"""
