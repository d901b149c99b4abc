"""The migration linter (tools/lint_migrations.py): it fails on an unsafe migration after the initial
one, naming each rule, passes the same change done the safe way, and passes the package's own
migrations. PostgreSQL only: the SQL it lints is PostgreSQL's."""

from __future__ import annotations

import pytest
from django.test import override_settings

from tests.support import IN_CI
from tools import lint_migrations

pytestmark = [pytest.mark.django_db, pytest.mark.usefixtures("postgres")]

SAMPLES = "tests.support.migration_samples"


@pytest.fixture(autouse=True)
def squawk() -> None:
    """Skip on a laptop without the npm tree, fail under CI (.ci/run installs it)."""
    try:
        lint_migrations.squawk_path()
    except lint_migrations.LinterUnavailable as exc:
        if IN_CI:
            pytest.fail(f"{exc}; under CI=true this is a failure")
        pytest.skip(str(exc))


def test_the_packages_own_migrations_pass():
    result = lint_migrations.lint()
    assert result.passed, result.report
    assert result.linted == tuple(lint_migrations.migrations_to_lint())
    assert "0001_initial" not in result.linted


@override_settings(MIGRATION_MODULES={"django_outbox": f"{SAMPLES}.unsafe"})
def test_an_unsafe_migration_fails_naming_each_rule():
    result = lint_migrations.lint()
    assert result.linted == ("0002_unsafe",)
    assert not result.passed, result.report
    for rule in ("require-concurrent-index-creation", "adding-required-field", "require-lock-timeout"):
        assert rule in result.report, result.report


# transaction=True: Django writes a concurrent index's SQL only outside a transaction.
@pytest.mark.django_db(transaction=True)
@override_settings(MIGRATION_MODULES={"django_outbox": f"{SAMPLES}.safe"})
def test_the_same_change_done_the_safe_way_passes():
    result = lint_migrations.lint()
    assert result.linted == (
        "0002_pending_unkeyed_index",
        "0003_mysql_claim_key_index",
        "0002_index",
        "0003_column",
        "0004_check",
    )
    assert result.passed, result.report


@override_settings(MIGRATION_MODULES={"django_outbox": f"{SAMPLES}.plain"})
def test_the_same_change_as_makemigrations_writes_it_fails():
    """The benchmark's reference: Django's own operations, each safe for the data, not for the locks."""
    result = lint_migrations.lint()
    assert result.linted == (
        "0002_pending_unkeyed_index",
        "0003_mysql_claim_key_index",
        "0002_index",
        "0003_column",
        "0004_check",
    )
    assert not result.passed, result.report
    for rule in ("require-concurrent-index-creation", "constraint-missing-not-valid", "require-lock-timeout"):
        assert rule in result.report, result.report


@pytest.mark.django_db(transaction=True)
@override_settings(MIGRATION_MODULES={"django_outbox": f"{SAMPLES}.contract"})
def test_taking_away_a_column_outside_a_post_deploy_migration_fails():
    result = lint_migrations.lint()
    assert not result.passed, result.report
    assert "0004_drop.sql:1:1: error: contract-without-post-deploy Remove field priority from message" in result.report


@pytest.mark.django_db(transaction=True)
@override_settings(MIGRATION_MODULES={"django_outbox": f"{SAMPLES}.post_deploy"})
def test_the_same_in_a_migration_marked_post_deploy_passes():
    result = lint_migrations.lint()
    assert result.linted == (
        "0002_pending_unkeyed_index",
        "0003_mysql_claim_key_index",
        "0002_index",
        "0003_column",
        "0004_drop",
    )
    assert result.passed, result.report
