"""The claim and the record under property-based testing: any interleaving of two workers' claims, of
deliveries that fail anywhere in a key's run, and of leases that expire (a worker that died) keeps each
key's messages in order and loses none.

Each example sends messages over a few keys (and some without a key), then plays a random plan: a worker
claims a batch, a worker delivers its oldest batch through the real pipeline (the handler fails the
messages the plan names), a worker dies (its leases expire and are reaped). After every claim, a key's
claimed messages are the first of its open messages and held by one worker; at the end everything is
drained and every key's messages must have first reached the handler in send order.
"""

from __future__ import annotations

from collections import defaultdict
from collections.abc import Callable
from typing import Any

import pytest
from django.db import connection
from django.test import override_settings
from hypothesis import example, given
from hypothesis import strategies as st

from django_outbox import outbox, store
from django_outbox.models import Attempt, Message
from django_outbox.transports.registry import TransportSet
from django_outbox.worker import Pipeline, RelayConfig, Stats

pytestmark = pytest.mark.django_db(transaction=True)

WORKERS = ("w1", "w2")
KEYS = ("a", "a", "b", "c", None)  # "a" twice: long runs of one key are the interesting case

claim_op = st.tuples(st.just("claim"), st.sampled_from(WORKERS), st.integers(1, 6))
deliver_op = st.tuples(st.just("deliver"), st.sampled_from(WORKERS), st.sets(st.integers(0, 5), max_size=2))
die_op = st.tuples(st.just("die"), st.sampled_from(WORKERS), st.just(0))
plans = st.lists(st.one_of(claim_op, claim_op, deliver_op, deliver_op, die_op), min_size=1, max_size=25)


def _open_rows() -> dict[str | None, list[tuple[int, str, str | None]]]:
    """Per key, its messages not finished, in id order: (id, status, holder)."""
    rows: dict[str | None, list[tuple[int, str, str | None]]] = defaultdict(list)
    for pk, key, status, holder in (
        Message.objects.filter(key__isnull=False, status__in=["pending", "processing"])
        .order_by("id")
        .values_list("id", "key", "status", "locked_by")
    ):
        rows[key].append((pk, status, holder))
    return rows


def _check_each_key_is_held_as_a_prefix() -> None:
    for key, rows in _open_rows().items():
        held = [(pk, holder) for pk, status, holder in rows if status == "processing"]
        assert [pk for pk, _ in held] == [pk for pk, _, _ in rows[: len(held)]], f"key {key}: {rows}"
        assert len({holder for _, holder in held}) <= 1, f"key {key} held by two workers: {rows}"


@override_settings(OUTBOX={"BACKOFF_BASE_SECONDS": 0, "BACKOFF_MAX_SECONDS": 0, "MAX_ATTEMPTS": 1000})
@given(keys=st.lists(st.sampled_from(KEYS), min_size=1, max_size=14), plan=plans)
@example(keys=["a", "a", "a", "b"], plan=[("claim", "w1", 4), ("deliver", "w1", {1})])  # a failure mid-run
@example(keys=["a", "a", "a"], plan=[("claim", "w1", 3), ("die", "w1", 0), ("claim", "w2", 2), ("deliver", "w2", {0})])
def test_any_interleaving_of_claims_failures_and_expiry_keeps_each_keys_order(
    handler: Callable[[str, Callable[..., object]], None], keys: list[str | None], plan: list[tuple[Any, ...]]
) -> None:
    Attempt.objects.all().delete()
    Message.objects.all().delete()
    arrived: list[int] = []
    failing: set[int] = set()

    def deliver(message: Message) -> None:
        if message.id in failing:
            raise ConnectionError("the destination is down")
        arrived.append(message.id)

    handler("prop.order", deliver)
    sent = [outbox.send("prop.order", {"n": n}, key=key) for n, key in enumerate(keys)]
    key_of = {m.id: m.key for m in sent}
    held: dict[str, list[list[Message]]] = {w: [] for w in WORKERS}
    pipelines = {}
    for worker in WORKERS:
        pipeline = Pipeline(RelayConfig.from_settings(worker_id=worker, handler_timeout=None), Stats())
        pipeline.run_direct()
        pipelines[worker] = pipeline
    for op, worker, arg in plan:
        if op == "claim":
            batch = store.claim("default", worker=worker, limit=arg, lease_seconds=600)
            if batch:
                held[worker].append(batch)
            _check_each_key_is_held_as_a_prefix()
        elif op == "deliver" and held[worker]:
            batch = held[worker].pop(0)
            failing.clear()
            failing.update(batch[i].id for i in arg if i < len(batch))
            pipelines[worker].process(batch, TransportSet())
            failing.clear()
            _check_each_key_is_held_as_a_prefix()
        elif op == "die":
            held[worker].clear()
            with connection.cursor() as cursor:
                cursor.execute(
                    "UPDATE django_outbox_message SET locked_until = %s WHERE locked_by = %s AND status = 'processing'",
                    [store.database_now("default").replace(year=2000), worker],
                )
            store.reap("default")
            _check_each_key_is_held_as_a_prefix()
    for worker in WORKERS:  # the workers that are left finish what they hold
        while held[worker]:
            pipelines[worker].process(held[worker].pop(0), TransportSet())
    for _ in range(len(sent) + 5):  # then one worker drains the rest
        batch = store.claim("default", worker="w1", limit=5, lease_seconds=600)
        if not batch:
            break
        pipelines["w1"].process(batch, TransportSet())
    assert set(Message.objects.values_list("status", flat=True)) == {"delivered"}
    firsts: dict[str | None, list[int]] = defaultdict(list)
    seen: set[int] = set()
    for pk in arrived:
        if pk not in seen:
            seen.add(pk)
            firsts[key_of[pk]].append(pk)
    assert seen == set(key_of), "a message never reached the handler"
    for key, order in firsts.items():
        if key is not None:
            assert order == sorted(order), f"key {key} first arrived as {order}"
