"""The worker's counters: a readable repr, and one snapshot for the closing line and the heartbeat."""

from __future__ import annotations

import re

from django_outbox.worker import Counts, Stats


def test_repr_shows_counts_elapsed_and_rate_not_a_monotonic_clock():
    stats = Stats(delivered=10, failed=2, dead=1)
    stats.started -= 4.0  # started four seconds ago
    text = repr(stats)
    assert "started" not in text and "lock" not in text
    assert re.fullmatch(r"<Stats delivered=10 failed=2 dead=1 in_flight=0 elapsed=4\.\ds rate=2\.\d/s>", text), text


def test_repr_names_the_rarer_counters_only_when_they_are_not_zero():
    stats = Stats(reaped=3, housekeeping_failures=1, housekeeping_error="boom")
    text = repr(stats)
    assert "reaped=3" in text and "housekeeping_failures=1" in text and "housekeeping_error='boom'" in text
    assert "lost_leases" not in text


def test_counts_take_every_failed_attempt_and_say_how_many_went_dead():
    stats = Stats(delivered=7, failed=3, dead=1, in_flight=2)
    counts = stats.counts()
    assert (counts.delivered, counts.failed, counts.dead, counts.in_flight) == (7, 4, 1, 2)
    assert counts.line().startswith("delivered 7  failed 4 (dead 1)  in flight 2  ")


def test_rate_is_deliveries_per_second_and_zero_before_any_time_passed():
    assert Counts(delivered=10, failed=0, dead=0, in_flight=0, elapsed=4.0).rate == 2.5
    assert Counts(delivered=10, failed=0, dead=0, in_flight=0, elapsed=0.0).rate == 0.0
