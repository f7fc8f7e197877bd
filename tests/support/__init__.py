"""Reusable helpers for tests that drive real components (Prometheus, HTTP pages).

* :mod:`tests.support.components` -- ``require_binary``: the skip-locally / fail-in-CI policy.
* :mod:`tests.support.pages` -- ``StaticPageServer``: a swappable /metrics page on 127.0.0.1.
* :mod:`tests.support.prometheus` -- ``running_prometheus``: a throw-away real Prometheus.
* :mod:`tests.support.databases` -- databases migrated once per test run, copied per test.
* :mod:`tests.support.python_twins` -- the tests on the Python twins of the C extensions.
* :mod:`tests.support.connection_origins` -- where a connection left open was opened.
"""
