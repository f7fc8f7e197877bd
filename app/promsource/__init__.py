"""Prometheus sources: engine metrics read with PromQL from a Prometheus-compatible HTTP API
(Prometheus, Thanos Query, Mimir, VictoriaMetrics) instead of scraped by this service.

``config`` is the YAML model, ``queries`` the PromQL (one query per signal for every
target of a source), ``reader`` turns answers into :class:`app.window.TargetWindow`,
``service`` runs discovery and keeps each source's status.
"""
