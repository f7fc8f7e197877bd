"""Shared fixtures. Storage and API suites run twice: on SQLite and on real PostgreSQL.

PostgreSQL: ``LLM_LATENCY_TEST_POSTGRES_URL`` (default: the local server, trust auth,
database ``test``). Each test session (each xdist worker) creates its own databases and drops
them at the end, so parallel runs and leftovers cannot interfere: one left empty for the tests
of migrations, one migrated once and cloned for each test that needs the schema (as SQLite's
migrated file is copied: tests/support/databases.py). Under ``CI=true`` an unreachable
PostgreSQL fails the tests that need it instead of skipping them.

Lanes: ``scripts/test.sh`` runs everything; ``scripts/test.sh --fast`` leaves out what is marked
``slow`` (here: :data:`SLOW_TESTS`, :data:`SERVER_FIXTURES`, every ``prometheus`` or ``real_engine``
test) or ``postgres`` (the PostgreSQL half of the storage and API tests: half the lane's time).
"""

from __future__ import annotations

import gc
import os
import uuid
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from dataclasses import dataclass
from pathlib import Path

import pytest
from sqlalchemy import create_engine, text
from sqlalchemy.engine import make_url

from tests.support import connection_origins, python_twins
from tests.support.components import missing_component
from tests.support.databases import PostgresTemplate, migrated_sqlite

if python_twins.forced():  # before any test imports the app (tests/support/python_twins.py)
    python_twins.hide_c_extensions()
connection_origins.record_connection_origins()

#: Every read computed anew: the tests of other features read right after writing behind the API's
#: back (a scrape stored, a heartbeat), which a reused answer shows only once it is read_max_age old
#: (app/runtime/changes.py). tests/api/test_coalesce.py tests the reuse with its own setting; a service
#: started by a test as a process inherits this.
os.environ.setdefault("LLM_LATENCY_READ_MAX_AGE", "0")
POSTGRES_ADMIN_URL = os.environ.get("LLM_LATENCY_TEST_POSTGRES_URL", "postgresql+psycopg://postgres@127.0.0.1:5432/test")
FIXTURES = Path(__file__).parent / "fixtures"


#: Tests marked with one of these run a real server or engine: they are ``slow`` too.
SLOW_BY_NATURE = ("prometheus", "real_engine")
#: Fixtures (module- or session-scoped) that start a real Prometheus, VictoriaMetrics or engine: a
#: test that uses one is ``slow``, however it is marked.
SERVER_FIXTURES = frozenset({"recording", "prometheus", "prometheus_over_history", "stack", "collected",
                             "vllm_server"})
#: Marked ``slow`` here, in one place (a file: all its tests; a function: all its parameters): tests
#: that run a real server, a cluster of processes or hours of simulated time, and every test that
#: took more than about 4 s on a 2-core machine running the suite on 4 workers. The fast lane
#: (``scripts/test.sh --fast``: ``-m "not slow and not postgres"``) leaves them out; the whole
#: suite runs them.
SLOW_TESTS = frozenset({
    # real processes, Prometheus (not through SERVER_FIXTURES), hours of simulated time
    "tests/test_replicas_processes.py",
    "tests/promsource/test_live_source.py",
    "tests/promsource/test_scrape_interval_live.py",
    "tests/promsource/test_read_flood.py",
    "tests/promsource/test_bad_series_live.py",
    "tests/promsource/test_counter_resets.py",
    "tests/promsource/test_native_histograms.py::test_a_histogram_held_as_a_native_histogram_alone_is_named_not_silently_missing",
    "tests/slo/test_burn_emulated.py",
    "tests/attribution/test_scenarios.py",
    "tests/status/test_status_sources.py::test_sources_on_the_status_page",
    "tests/status/test_status_sources_browser.py",
    # the Kubernetes kit: kubectl kustomize builds ~20 variants; the generator exports rules and dashboards;
    # the Helm chart: helm lint and helm template of the same variants, compared with the kit's builds
    "tests/deploy/test_kubernetes.py",
    "tests/deploy/test_helm.py",
    "tests/deploy/test_generate_kubernetes.py",
    # more than about 4 s
    "tests/attribution/test_changepoint.py::test_steady_load_raises_almost_no_false_alarm",
    "tests/attribution/test_events.py::test_the_events_round_stores_regime_changes_and_steps",
    "tests/test_cli.py::test_serve_names_its_sqlite_file_and_a_restart_after_a_clean_stop_warns_of_nothing",
    "tests/test_cli.py::test_demo_on_a_taken_engine_port_exits_1_naming_it",
    "tests/test_cli.py::test_demo_serves_its_engines_on_pinned_ports",
    "tests/diagnosis/test_family_removal.py::test_removing_families_never_makes_a_verdict_healthy",
    "tests/alerts/test_delivery.py::test_retries_back_off_exponentially_with_jitter_then_expire_and_the_group_moves_on",
    "tests/alerts/test_outbox.py::test_an_active_diagnosis_becomes_an_alert_with_its_cause_and_remedies",
    "tests/api/test_concurrent_clients.py::test_fifty_concurrent_clients_get_no_error",
    "tests/api/test_fleet_statements.py::test_fleet_endpoints_run_the_same_statements_for_5_and_50_targets",
    "tests/api/test_openapi_schemas.py::test_answers_with_data_validate_against_their_schemas",
    "tests/api/test_request_budget.py::test_a_disconnected_client_stops_the_fleet_computation_early",
    "tests/api/test_request_budget.py::test_a_raw_read_interrupted_while_its_rows_are_fetched_is_ended_by_the_budget",
    "tests/api/test_request_budget.py::test_a_read_whose_client_went_away_stops",
    "tests/api/test_serialized.py::test_kept_answers_follow_every_change",
    "tests/api/test_serialized.py::test_the_answers_are_fastapis_own_bytes",
    "tests/diagnosis/test_round_statements.py::test_statements_per_round_do_not_grow_with_the_number_of_targets",
    "tests/diagnosis/test_rules.py::test_a_symptom_of_two_firing_causes_names_the_first_by_precedence_in_every_process",
    "tests/grafana/test_source_dashboards.py::"
    "test_a_source_config_needs_its_own_directory_and_a_choice_among_several_sources",
    "tests/probe/test_api.py::test_post_runs_a_prompt_length_sweep",
    "tests/probe/test_cli.py::test_a_prompt_sweep_reports_the_ladder_and_the_fitted_prefill_cost",
    "tests/probe/test_emulated.py::test_concurrency_sweep_shows_itl_rising_with_load",
    "tests/probe/test_emulated.py::test_prompt_sweep_fits_the_prefill_cost",
    "tests/probe/test_emulated.py::test_single_vs_concurrent_separates_queueing_from_bandwidth_bound",
    "tests/promsource/test_hostile_answers.py::test_no_hostile_answer_escapes_and_the_other_target_is_untouched",
    "tests/slo/test_record.py::test_migration_creates_the_slo_table_as_the_model_says",
    "tests/slo/test_record.py::test_old_rows_are_merged_keeping_every_request",
    "tests/status/test_status_page.py::test_index_is_a_fleet_table_most_severe_first",
    "tests/status/test_status_page.py::test_index_runs_a_fixed_number_of_queries_whatever_the_fleet_size",
    "tests/status/test_status_page.py::test_labels_and_errors_are_escaped",
    "tests/status/test_status_page.py::test_target_page_details",
    "tests/status/test_status_page.py::test_target_page_shows_the_diagnosis_in_full",
    "tests/test_capacity.py::test_an_slo_burning_its_budget_asks_for_one_more_replica",
    "tests/test_cli.py::test_serve_on_an_unmigrated_postgresql_says_to_run_db_upgrade",
    "tests/test_cli.py::test_serve_with_a_bad_config_lists_its_problems_and_does_not_start",
    "tests/test_cli.py::test_serve_with_postgresql_down_prints_one_line_and_no_banner",
    "tests/test_replicas.py::test_the_service_refuses_a_second_replica_on_sqlite_and_starts_after_a_kill",
})


@pytest.hookimpl(tryfirst=True)  # before ``-m`` selects by the markers
def pytest_collection_modifyitems(config: pytest.Config, items: list[pytest.Item]) -> None:
    for item in items:
        if item.get_closest_marker("slow") is not None:
            continue
        function = item.nodeid.split("[", 1)[0]
        if (function in SLOW_TESTS or function.split("::", 1)[0] in SLOW_TESTS
                or any(item.get_closest_marker(m) for m in SLOW_BY_NATURE)
                or not SERVER_FIXTURES.isdisjoint(getattr(item, "fixturenames", ()))):
            item.add_marker(pytest.mark.slow)
    # Modules whose tests are all slow first, then those with some: the long ones start early, so
    # xdist's workers end together rather than one running the last soak alone. A module's tests
    # keep their order and stay together.
    slow_share: dict[str, list[bool]] = {}
    for item in items:
        slow_share.setdefault(item.nodeid.split("::", 1)[0], []).append(item.get_closest_marker("slow") is not None)
    group = {module: 0 if all(marks) else 1 if any(marks) else 2 for module, marks in slow_share.items()}
    items.sort(key=lambda item: group[item.nodeid.split("::", 1)[0]])


#: Measurements xdist workers reported (tests/real_engine/conftest.py), printed by the controller.
WORKER_REPORTS: dict[str, str] = {}


@pytest.hookimpl(optionalhook=True)  # an xdist hook: only called where pytest-xdist runs the workers
def pytest_testnodedown(node: object, error: object) -> None:
    WORKER_REPORTS.update(getattr(node, "workeroutput", {}).get("real_engine_report", {}))


def pytest_terminal_summary(terminalreporter: pytest.TerminalReporter) -> None:
    if WORKER_REPORTS:
        terminalreporter.section("real engine (vLLM CPU) measurements")
        for key, value in WORKER_REPORTS.items():
            terminalreporter.write_line(f"{key}: {value}")


def pytest_sessionstart(session: pytest.Session) -> None:
    if python_twins.forced():
        python_twins.check_hidden()


@pytest.hookimpl(wrapper=True)
def pytest_runtest_protocol(item: pytest.Item, nextitem: pytest.Item | None) -> object:
    connection_origins.current_test[0] = item.nodeid
    try:
        return (yield)
    finally:
        connection_origins.current_test[0] = ""


@pytest.fixture(autouse=True)
def _collect_garbage_after_each_test() -> Iterator[None]:
    """``LLM_LATENCY_TEST_GC_EACH=1``: a full garbage collection after each test, so a connection
    a test leaves open is reported in that test's teardown instead of in whichever test runs when
    the collector happens to find it (tests/support/connection_origins.py names where it was opened)."""
    yield
    if os.environ.get("LLM_LATENCY_TEST_GC_EACH"):
        gc.collect()


@dataclass
class ScratchDatabase:
    url: str
    drop: Callable[[], None]  # drops it now, its connections terminated (an outage, for a test)


@contextmanager
def scratch_postgres_database(prefix: str = "llm_latency_test") -> Iterator[ScratchDatabase]:
    """A new PostgreSQL database, dropped on exit (and its connections terminated); fails,
    or skips outside CI, when PostgreSQL is not reachable."""
    admin = create_engine(POSTGRES_ADMIN_URL, isolation_level="AUTOCOMMIT")
    name = f"{prefix}_{uuid.uuid4().hex[:10]}"
    try:
        with admin.connect() as connection:
            connection.execute(text(f'CREATE DATABASE "{name}"'))
    except Exception as exc:
        admin.dispose()
        missing_component(f"PostgreSQL not reachable at {POSTGRES_ADMIN_URL}: {type(exc).__name__}: {exc}")

    def drop() -> None:
        with admin.connect() as connection:
            connection.execute(text(f'DROP DATABASE IF EXISTS "{name}" WITH (FORCE)'))

    try:
        yield ScratchDatabase(make_url(POSTGRES_ADMIN_URL).set(database=name).render_as_string(hide_password=False),
                              drop)
    finally:
        drop()
        admin.dispose()


@pytest.fixture(scope="session")
def postgres_database() -> Iterator[str]:
    """A fresh PostgreSQL database for this test session; yields its URL."""
    with scratch_postgres_database() as database:
        yield database.url


def _reset_postgres(url: str) -> None:
    """Drop every table (and Alembic's version table) so each test starts from nothing."""
    engine = create_engine(url, isolation_level="AUTOCOMMIT")
    with engine.connect() as connection:
        connection.execute(text("DROP SCHEMA public CASCADE"))
        connection.execute(text("CREATE SCHEMA public"))
    engine.dispose()


@pytest.fixture(scope="session")
def postgres_template() -> Iterator[PostgresTemplate]:
    """A PostgreSQL database migrated to head once for this test session, cloned per test."""
    with scratch_postgres_database("llm_latency_template") as database:
        admin = create_engine(POSTGRES_ADMIN_URL, isolation_level="AUTOCOMMIT")
        try:
            yield PostgresTemplate(admin, database.url)
        finally:
            admin.dispose()


@pytest.fixture(params=["sqlite", pytest.param("postgresql", marks=pytest.mark.postgres)])
def database_url(request: pytest.FixtureRequest, tmp_path: Path) -> Iterator[str]:
    """An empty database (no schema yet) on each backend -- or, when the test asks for
    ``migrated_url``, the same database at the head revision (then both name one database).

    A migrated one is a copy of a database migrated once per test session (tests/support/databases.py):
    SQLite's file copied, PostgreSQL's cloned from a template and dropped after the test."""
    migrated = "migrated_url" in request.fixturenames
    if request.param == "sqlite":
        path = tmp_path / "test.db"
        yield migrated_sqlite(path) if migrated else f"sqlite:///{path}"
        return
    if migrated:
        template: PostgresTemplate = request.getfixturevalue("postgres_template")
        url = template.clone()
        try:
            yield url
        finally:
            template.drop(url)
        return
    url = request.getfixturevalue("postgres_database")
    _reset_postgres(url)
    yield url


@pytest.fixture
def migrated_url(database_url: str) -> str:
    """A database at the head revision on each backend (see :func:`database_url`)."""
    return database_url


@pytest.fixture
def store(migrated_url: str) -> Iterator[tuple]:
    """A migrated database with one target ``t1``: (SQLAlchemy engine, sessionmaker, target id)."""
    from app.store import db
    from app.targets import repository as target_repository

    engine = db.make_engine(migrated_url)
    sessions = db.make_sessionmaker(engine)
    with sessions.begin() as session:
        target = target_repository.create_target(session, name="t1", url="http://127.0.0.1:1/metrics", engine="auto",
                                          labels={}, scrape_interval=15.0, scrape_timeout=5.0)
        target_id = target.id
    yield engine, sessions, target_id
    engine.dispose()
