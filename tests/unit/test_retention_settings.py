"""Settings of ordering and retention: defaults, accepted forms, and check ids E070-E074."""

from __future__ import annotations

import datetime as dt

import pytest
from django.test import override_settings

from django_outbox.conf import get_settings
from django_outbox.exceptions import OutboxImproperlyConfigured
from tests.support.checks import outbox_errors


def test_defaults():
    s = get_settings()
    assert (s.ORDERING, s.RETENTION_MODE) == ("block", "archive")
    assert (s.RETENTION, s.ARCHIVE_AFTER) == (dt.timedelta(days=7), dt.timedelta(hours=1))
    assert s.HOUSEKEEPING_INTERVAL_SECONDS == 60.0


def test_durations_take_seconds_or_timedeltas():
    with override_settings(OUTBOX={"RETENTION": 3600, "ARCHIVE_AFTER": dt.timedelta(minutes=5)}):
        s = get_settings()
        assert (s.RETENTION, s.ARCHIVE_AFTER) == (dt.timedelta(hours=1), dt.timedelta(minutes=5))
    with override_settings(OUTBOX={"ORDERING": "skip_dead", "RETENTION_MODE": "delete"}):
        assert (get_settings().ORDERING, get_settings().RETENTION_MODE) == ("skip_dead", "delete")
    with override_settings(OUTBOX={"HOUSEKEEPING_INTERVAL_SECONDS": 0}):
        assert get_settings().HOUSEKEEPING_INTERVAL_SECONDS == 0.0


@pytest.mark.parametrize(
    ("outbox", "expected"),
    [
        ({"ORDERING": "strict"}, "django_outbox.E070"),
        ({"RETENTION": 0}, "django_outbox.E071"),
        ({"RETENTION": "7d"}, "django_outbox.E071"),
        ({"RETENTION_MODE": "drop"}, "django_outbox.E072"),
        ({"ARCHIVE_AFTER": dt.timedelta(seconds=-1)}, "django_outbox.E073"),
        ({"HOUSEKEEPING_INTERVAL_SECONDS": -5}, "django_outbox.E074"),
        ({"HOUSEKEEPING_INTERVAL_SECONDS": "60"}, "django_outbox.E074"),
    ],
)
def test_malformed_retention_settings_are_reported(outbox, expected):
    with override_settings(OUTBOX=outbox):
        assert outbox_errors() == [expected]
        with pytest.raises(OutboxImproperlyConfigured, match=expected):
            get_settings()
