"""Size limits on everything a user can send: the HTTP API's bodies and fields, and the
targets YAML (which shares its models with the API).

Without them one request could store a 100 MB label value (every status-page render then
carries it) or hand the scheduler an interval it cannot represent. The numbers are
generous for real fleets and are documented in docs/api.md#limits; a value past one is
refused with a 422 (API) or a config error naming the field.
"""

from __future__ import annotations

import re
from typing import Annotated, Protocol, TypeVar

from pydantic import Field, StringConstraints

MAX_REQUEST_BYTES = 1024 * 1024  # default of LLM_LATENCY_MAX_REQUEST_BYTES: a whole request body
MAX_LABEL_NAME_LENGTH = 128
MAX_LABEL_VALUE_LENGTH = 1024
MAX_LABELS = 32  # per target, and per receiver's ``match``
MAX_URL_LENGTH = 2048
MAX_MATCHERS = 32  # per silence
MAX_MATCHER_LENGTH = 1024  # a matcher as text (name, operator, quoted value)
MAX_HEADERS = 32  # per receiver
MAX_HEADER_VALUE_LENGTH = 4096
MAX_TEXT_LENGTH = 256  # short free text: hardware names, environment variable names
MAX_LIST_LENGTH = 1000  # targets, receivers, SLOs, group_by, an SLO's target list
MAX_INTERVAL_SECONDS = 86400.0  # scrape intervals and timeouts, canary intervals: one day
MAX_UNIX_TIME = 253402300799.0  # 9999-12-31T23:59:59Z, the last second datetime can show
MAX_ID = 2**63 - 1  # a database id (BIGINT)

# What one target's pages may bring (Prometheus' ``sample_limit``): per target in the targets
# YAML and API, the service's defaults in the settings (``default_sample_limit``, ...). Past
# one the scrape is refused (``too_many_samples``/``too_many_series``, the target down for it)
# and nothing of it is stored. The real pages (tests/fixtures/exposition) keep at most 363
# samples and 22 stored series per model and rank (vLLM 0.32's real page: 250 samples, 20
# series and 2 infos; vLLM 0.10's DP2 page 139 and 8 per rank; TGI 363 and 12). Repeated per
# model, the real vLLM page's model lines fill the 4 MiB page cap at 123 models and ranks:
# 30,628 kept samples, 2,584 stored series (tests/scrape/test_limits.py builds that page).
#: samples of the engine's families on one page: 1.6x that largest real page (a 20,000-bucket
#: histogram fits); a page of the shortest lines under the same byte cap holds 150,000
DEFAULT_SAMPLE_LIMIT = 50_000
#: stored series (histograms, gauges, counters and infos per model and rank) on one page: 1.9x
#: that largest real page
DEFAULT_SERIES_LIMIT = 5_000
#: series a target may have stored (series and info rows, kept while the target exists): twice
#: the series limit, ~475 models and ranks of the real vLLM page (21 rows each) over the
#: target's life. The writer's caches of a target are in proportion: a target whose page
#: renames its models every scrape stops here instead of growing the series table and the
#: process without bound
DEFAULT_STORED_SERIES_LIMIT = 10_000
MAX_SCRAPE_LIMIT = 2**31 - 1  # the largest value of a limit: an INTEGER column

#: Target (and receiver) names: safe in URLs, file names and metric labels.
NAME_PATTERN = r"^[A-Za-z0-9][A-Za-z0-9_.-]{0,62}$"
#: Target label names: Prometheus' label-name rule, minus the labels the service sets itself.
LABEL_NAME = re.compile(r"^[a-zA-Z_][a-zA-Z0-9_]*$")
RESERVED_LABELS = frozenset({"target", "model", "engine", "le", "quantile", "signal"})

LabelName = Annotated[str, StringConstraints(max_length=MAX_LABEL_NAME_LENGTH)]
LabelValue = Annotated[str, StringConstraints(max_length=MAX_LABEL_VALUE_LENGTH)]
Labels = Annotated[dict[LabelName, LabelValue], Field(max_length=MAX_LABELS)]
Url = Annotated[str, StringConstraints(max_length=MAX_URL_LENGTH)]
UnixTime = Annotated[float, Field(ge=0, le=MAX_UNIX_TIME, allow_inf_nan=False)]


class _Named(Protocol):
    @property
    def name(self) -> str: ...


_N = TypeVar("_N", bound=_Named)


def unique_names(items: list[_N], list_name: str, what: str) -> list[_N]:
    """A list validator: every ``name`` once, or an error naming both places
    (``duplicate target name 'a' (targets[0] and targets[3])``)."""
    first: dict[str, int] = {}
    for index, item in enumerate(items):
        if item.name in first:
            raise ValueError(f"duplicate {what} name {item.name!r} ({list_name}[{first[item.name]}] and "
                             f"{list_name}[{index}])")
        first[item.name] = index
    return items
