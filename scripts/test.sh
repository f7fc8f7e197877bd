#!/usr/bin/env bash
# Installs everything the test suite needs on a fresh Debian machine, then runs it.
# Extra arguments go to pytest (e.g. scripts/test.sh tests/test_api.py -k latency).
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
exec python3 -m pytest "$@"
