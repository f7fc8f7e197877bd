#!/usr/bin/env bash
# Installs everything the test suite needs on a fresh Debian machine, then runs it.
#
#   scripts/test.sh           the whole suite, as CI runs it, then the parser, vectors and ingest
#                             tests once more on the Python twins of the C extensions (an install
#                             without a C compiler: tests/support/python_twins.py)
#   scripts/test.sh --fast    the daily lane: every test not marked slow or postgres, on SQLite (no
#                             real PostgreSQL, Prometheus, Alertmanager, VictoriaMetrics, browser or
#                             engine, no soaks: tests/conftest.py marks them)
#   scripts/test.sh ARGS...   pytest ARGS (e.g. scripts/test.sh tests/test_api.py -k latency)
#
# Each ends with its duration and the 15 slowest tests. The suite and the fast lane run on
# LLM_LATENCY_TEST_WORKERS pytest-xdist workers (default: the cores + 1, at most 4; 0: in this one
# process, as pytest ARGS does unless the variable is set).
set -euo pipefail
cd "$(dirname "$0")/.."

as_root() { if [ "$(id -u)" = 0 ]; then "$@"; else sudo "$@"; fi; }

# Debian packages: Prometheus/promtool are the PromQL oracle and rule checker,
# VictoriaMetrics a second server of the same query API (Prometheus sources),
# Alertmanager the real receiver of exported alerts, Chromium the status page's browser,
# Node.js runs the Prometheus Operator's resource validators.
missing=()
command -v prometheus >/dev/null 2>&1 || missing+=(prometheus)
command -v prometheus-alertmanager >/dev/null 2>&1 || missing+=(prometheus-alertmanager)
[ -x /usr/bin/victoria-metrics ] || missing+=(victoria-metrics)
command -v openssl >/dev/null 2>&1 || missing+=(openssl)
command -v chromium >/dev/null 2>&1 || missing+=(chromium)
command -v pg_isready >/dev/null 2>&1 || missing+=(postgresql-client)
command -v npm >/dev/null 2>&1 || missing+=(nodejs npm)
if [ ${#missing[@]} -gt 0 ]; then
    as_root apt-get update -qq
    as_root env DEBIAN_FRONTEND=noninteractive apt-get install -y -qq --no-install-recommends "${missing[@]}"
fi

# PostgreSQL on 127.0.0.1:5432 (trust auth, database "test"): start it if it is down.
if ! pg_isready -q -h 127.0.0.1 -p 5432; then
    if [ -d /etc/postgresql ]; then
        as_root pg_ctlcluster --skip-systemctl-redirect "$(ls /etc/postgresql | sort -V | tail -1)" main start || true
    fi
    for _ in $(seq 1 30); do pg_isready -q -h 127.0.0.1 -p 5432 && break; sleep 1; done
fi

python3 -m pip install --quiet --disable-pip-version-check -e '.[test]'
# Validators generated from the Prometheus Operator's API types (tests/deploy), pinned by the lock file.
npm ci --prefix tests/deploy/operator_models --no-audit --no-fund --silent
# Lint and type gates first (scripts/check: ruff, mypy with its per-file baseline).
python3 scripts/check

# One worker more than the cores (most tests wait on servers, sockets and clocks), at most 4.
cores=$(nproc 2>/dev/null || echo 2)
default_workers=$((cores + 1 > 4 ? 4 : cores + 1))
case "${1:-}" in "" | --fast) workers=${LLM_LATENCY_TEST_WORKERS:-$default_workers} ;; *) workers=${LLM_LATENCY_TEST_WORKERS:-0} ;; esac
# loadscope: a module's tests share one worker, so a module-scoped server starts once; in the
# order tests/conftest.py gives them (the long modules first), not xdist's (the most tests first)
parallel=()
if [ "$workers" != 0 ]; then parallel=(-n "$workers" --dist loadscope --no-loadscope-reorder); fi
# the parser, vectors and ingest (store, adapters) tests, run again without the C extensions
twin_tests=(tests/scrape/test_parser.py tests/test_vectors.py tests/store tests/sources)

started=$SECONDS
status=0
case "${1:-}" in
    "")
        python3 -m pytest "${parallel[@]}" --durations=15 || status=$?
        suite=$((SECONDS - started))
        echo "== the parser, vectors and ingest tests on the Python twins of the C extensions"
        LLM_LATENCY_TEST_PYTHON_TWINS=1 python3 -m pytest "${parallel[@]}" -q --durations=5 "${twin_tests[@]}" \
            || status=$?
        echo "== test suite: $((suite / 60)) min $((suite % 60)) s; with the Python twins' run:" \
             "$(((SECONDS - started) / 60)) min $(((SECONDS - started) % 60)) s"
        ;;
    --fast)
        shift
        python3 -m pytest "${parallel[@]}" -m "not slow and not postgres" --durations=15 "$@" || status=$?
        echo "== fast lane: $(((SECONDS - started) / 60)) min $(((SECONDS - started) % 60)) s"
        ;;
    *)
        python3 -m pytest "${parallel[@]}" --durations=15 "$@" || status=$?
        echo "== tests: $(((SECONDS - started) / 60)) min $(((SECONDS - started) % 60)) s"
        ;;
esac
exit "$status"
