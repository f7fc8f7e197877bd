"""Reusable helpers for tests that drive real components (Prometheus, HTTP pages).

* :mod:`tests.support.components` -- ``require_binary``: the skip-locally / fail-in-CI policy.
* :mod:`tests.support.pages` -- ``StaticPageServer``: a swappable /metrics page on 127.0.0.1.
* :mod:`tests.support.prometheus` -- ``running_prometheus``: a throw-away real Prometheus.
"""
