"""The per-batch pipeline of the worker, driven without threads: claim a batch, hand it over, look."""

from __future__ import annotations

from collections.abc import Mapping, Sequence

import pytest

from django_outbox import outbox, store
from django_outbox.models import Message
from django_outbox.routing import resolve_transport
from django_outbox.transports.registry import TransportSet
from django_outbox.worker import Pipeline, RelayConfig, Stats
from django_outbox.worker import pipeline as pipeline_module
from tests.support import logs
from tests.support.factories import MessageFactory

pytestmark = pytest.mark.django_db(transaction=True)


def claimed(config: RelayConfig) -> list[Message]:
    return store.claim(config.database, worker=config.worker_id, limit=config.batch_size, lease_seconds=60)


def test_a_batch_is_delivered_recorded_and_counted_without_threads(handler):
    handler("p.ok", lambda m: None)
    handler("p.bad", lambda m: 1 / 0)
    ok, bad = outbox.send("p.ok", {}), outbox.send("p.bad", {})
    config = RelayConfig.from_settings(notify=False)
    stats = Stats()
    transports = TransportSet()
    try:
        Pipeline(config, stats).process(claimed(config), transports)
    finally:
        transports.close()
    ok.refresh_from_db()
    bad.refresh_from_db()
    assert ok.status == Message.Status.DELIVERED
    assert bad.status == Message.Status.PENDING and "ZeroDivisionError" in bad.last_error
    assert (stats.delivered, stats.failed, stats.dead, stats.in_flight) == (1, 1, 0, 0)


def test_the_topic_of_each_message_is_resolved_to_a_transport_once(handler, monkeypatch):
    handler("p.one", lambda m: None)
    handler("p.two", lambda m: None)
    for topic in ("p.one", "p.one", "p.two", "p.nowhere", "p.one"):
        if topic == "p.nowhere":  # written as if its route had been removed since: send() would refuse it
            MessageFactory(topic=topic)
        else:
            outbox.send(topic, {})
    calls: list[str] = []

    def counting(topic: str) -> str:
        calls.append(topic)
        return resolve_transport(topic)

    monkeypatch.setattr(pipeline_module, "resolve_transport", counting)
    config = RelayConfig.from_settings(notify=False)
    batch = claimed(config)
    transports = TransportSet()
    try:
        Pipeline(config, Stats()).process(batch, transports)
    finally:
        transports.close()
    assert sorted(calls) == sorted(m.topic for m in batch) and len(batch) == 5
    nowhere = Message.objects.get(topic="p.nowhere")
    assert "UnknownTopicError" in nowhere.last_error  # a topic nothing serves fails its attempt, as before


def test_an_observer_is_told_each_transport_instead_of_resolving_it_again(handler):
    """With metrics on, the topic is still resolved once per message: the observer gets the pipeline's answer.

    Counted on ``resolve_transport``'s cache, which every caller goes through whatever name it imported it
    under, so a second resolution anywhere (the metrics' labels did one per outcome) shows."""
    from prometheus_client import CollectorRegistry

    from django_outbox.observability.metrics import NO_TRANSPORT, WorkerMetrics

    handler("p.one", lambda m: None)
    handler("p.two", lambda m: 1 / 0)
    for topic in ("p.one", "p.two", "p.one"):
        outbox.send(topic, {})
    nowhere = MessageFactory(topic="p.nowhere")  # its route removed since it was sent
    registry = CollectorRegistry()
    config = RelayConfig.from_settings(notify=False)
    batch = claimed(config)
    seen: list[dict[int, str]] = []

    class Watching(WorkerMetrics):
        def batch_done(
            self,
            batch: Sequence[Message],
            outcomes: Sequence[store.Outcome],
            lost: set[int],
            transports: Mapping[int, str],
        ) -> None:
            seen.append(dict(transports))
            super().batch_done(batch, outcomes, lost, transports)

    resolve_transport.cache_clear()
    transports = TransportSet()
    try:
        Pipeline(config, Stats(), observer=Watching(registry)).process(batch, transports)
    finally:
        transports.close()
    info = resolve_transport.cache_info()
    assert info.hits + info.misses == len(batch) == 4
    handled = resolve_transport("p.one")
    assert seen == [{m.id: handled for m in batch if m.id != nowhere.id}]
    assert registry.get_sample_value("outbox_messages_delivered_total", {"topic": "p.one", "transport": handled}) == 2
    assert registry.get_sample_value("outbox_messages_failed_total", {"topic": "p.two", "transport": handled}) == 1
    assert registry.get_sample_value("outbox_messages_failed_total", {"topic": "p.nowhere", "transport": NO_TRANSPORT})


class _Transports:
    """Stands for a TransportSet: transport "a" delivers in batches, "b" one by one."""

    class _T:
        def __init__(self, batching: bool) -> None:
            self.batching = batching

        def supports_batch(self) -> bool:
            return self.batching

    def get(self, name: str) -> _T:
        return self._T(name == "a")


def _groups(routes: Sequence[pipeline_module.Route]) -> list[tuple[int, int]]:
    groups, start = [], 0
    while start < len(routes):
        end = Pipeline._group_end(routes, start, _Transports())  # type: ignore[arg-type]
        groups.append((start, end))
        start = end
    return groups


def test_consecutive_messages_of_a_batching_transport_form_one_group():
    unknown = LookupError("no route")
    assert _groups(["a", "a", "b", "b", unknown, "a", "a"]) == [(0, 2), (2, 3), (3, 4), (4, 5), (5, 7)]


def test_an_outcome_whose_lease_was_lost_meanwhile_is_counted_said_and_not_announced(handler):
    """Another worker took the message over while this one delivered (its lease ran out and was reaped):
    this worker's outcome does not change the message, it counts as a lost lease, the log says so, the
    audit keeps the attempt, and no signal claims a delivery the table does not hold."""
    from django_outbox import signals

    def taken_over_meanwhile(message: Message) -> None:
        Message.objects.filter(pk=message.pk).update(locked_by="another-worker")

    handler("p.taken", taken_over_meanwhile)
    handler("p.ok", lambda m: None)
    taken, ok = outbox.send("p.taken", {}), outbox.send("p.ok", {})
    config = RelayConfig.from_settings(notify=False)
    stats = Stats()
    announced: list[int] = []

    def on_delivered(sender, message, **kwargs):
        announced.append(message.pk)

    signals.message_delivered.connect(on_delivered)
    transports = TransportSet()
    try:
        with logs.captured() as records:
            Pipeline(config, stats).process(claimed(config), transports)
    finally:
        transports.close()
        signals.message_delivered.disconnect(on_delivered)
    assert (stats.lost_leases, stats.delivered) == (1, 1)
    assert announced == [ok.pk]
    said = [r.getMessage() for r in records if "lease lost" in r.getMessage()]
    assert said == [f"lease lost for p.taken #{taken.pk} (attempt 1) before its outcome was recorded"]
    taken.refresh_from_db()
    assert taken.status == Message.Status.PROCESSING and taken.locked_by == "another-worker"
    (attempt,) = taken.attempt_log.all()  # the audit keeps the attempt, marked as made without the lease
    assert "lease lost before this outcome was recorded" in attempt.error
