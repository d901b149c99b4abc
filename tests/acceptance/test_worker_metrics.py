"""``outbox_worker --metrics-port``: a real worker process, scraped over HTTP after real deliveries."""

from __future__ import annotations

import re
import signal
import socket
import urllib.request

import pytest
from prometheus_client.parser import text_string_to_metric_families

from django_outbox import outbox
from django_outbox.models import Message
from django_outbox.observability.labels import MAX_TOPIC_LABELS
from django_outbox.routing import resolve_transport
from tests.probe.models import Delivery
from tests.support.processes import WorkerProcess
from tests.support.waiting import wait_for

pytestmark = [pytest.mark.django_db(transaction=True), pytest.mark.slow]

SERVING = re.compile(r"metrics on (http://[^ ]+/metrics)")


def metrics_url(worker: WorkerProcess) -> str:
    """The address the worker printed (it was given port 0: the system chose a free one)."""
    assert worker.proc.stdout is not None
    seen = []
    for line in worker.proc.stdout:  # the first lines it prints; ends if the process dies
        seen.append(line)
        match = SERVING.search(line)
        if match:
            return match.group(1)
    pytest.fail("the worker never said where it serves metrics:\n" + "".join(seen))


def scrape(url: str) -> dict[tuple[str, frozenset[tuple[str, str]]], float]:
    with urllib.request.urlopen(url, timeout=10) as response:
        assert response.status == 200
        assert response.headers["Content-Type"].startswith("text/plain")
        text = response.read().decode()
    return {
        (sample.name, frozenset(sample.labels.items())): sample.value
        for family in text_string_to_metric_families(text)
        for sample in family.samples
    }


def value(samples: dict[tuple[str, frozenset[tuple[str, str]]], float], name: str, **labels: str) -> float | None:
    return samples.get((name, frozenset(labels.items())))


@pytest.mark.database_independent
def test_a_scrape_counts_what_the_worker_delivered_failed_and_killed(worker_process):
    for n in range(3):
        outbox.send("probe.ok", {"n": n})
    doomed = outbox.send("probe.doomed", {"always_fail": True}, max_attempts=2)
    transport = resolve_transport("probe.ok")
    worker = worker_process("--metrics-port", "0", "--poll-interval", "0.2")
    url = metrics_url(worker)
    assert url.startswith("http://127.0.0.1:")  # the default address: this host only
    wait_for(lambda: Message.objects.get(pk=doomed.pk).status == "dead", timeout=60)
    wait_for(lambda: Message.objects.filter(status="delivered").count() == 3, timeout=60)

    def counted() -> bool:
        samples = scrape(url)
        return value(samples, "outbox_messages_dead_total", topic="probe.doomed", transport=transport) == 1

    wait_for(counted, timeout=30)  # the record is stored before the counters move
    samples = scrape(url)
    assert value(samples, "outbox_messages_delivered_total", topic="probe.ok", transport=transport) == 3
    assert value(samples, "outbox_messages_failed_total", topic="probe.doomed", transport=transport) == 2
    assert value(samples, "outbox_messages_failed_total", topic="probe.ok", transport=transport) is None
    assert value(samples, "outbox_messages_dead_total", topic="probe.doomed", transport=transport) == 1
    assert value(samples, "outbox_delivery_duration_seconds_count", transport=transport) == 5  # 3 + 2 attempts
    assert value(samples, "outbox_claim_duration_seconds_count") >= 3  # at least one claim per attempt round
    assert value(samples, "outbox_worker_threads_busy") == 0

    def sampled() -> bool:  # the backlog gauges come from a sample every few seconds
        s = scrape(url)
        return (
            value(s, "outbox_backlog_messages", status="delivered") == 3
            and value(s, "outbox_backlog_messages", status="dead") == 1
            and (value(s, "outbox_workers_alive") or 0) >= 1
        )

    wait_for(sampled, timeout=30, interval=0.5)
    samples = scrape(url)
    assert value(samples, "outbox_backlog_messages", status="pending") == 0
    assert value(samples, "outbox_lag_seconds") == 0
    assert value(samples, "outbox_blocked_keys") == 0


def test_only_one_worker_samples_the_backlog_on_postgresql(postgres, worker_process):
    first = worker_process("--metrics-port", "0", "--poll-interval", "0.2")
    second = worker_process("--metrics-port", "0", "--poll-interval", "0.2")
    urls = [metrics_url(first), metrics_url(second)]
    outbox.send("probe.ok", {})

    def one_samples() -> bool:
        exporting = [value(scrape(u), "outbox_backlog_messages", status="delivered") for u in urls]
        return sorted(exporting, key=lambda v: v is None) == [1, None]

    wait_for(one_samples, timeout=30, interval=0.5)
    workers = [first, second]
    leader = next(i for i, u in enumerate(urls) if value(scrape(u), "outbox_backlog_messages", status="delivered"))
    workers[leader].stop()  # the lock goes with its session: the other worker takes over the sampling
    other = urls[1 - leader]
    wait_for(lambda: value(scrape(other), "outbox_backlog_messages", status="delivered") == 1, timeout=30)


@pytest.mark.database_independent
def test_a_taken_port_is_a_clear_error(worker_process):
    with socket.socket() as taken:
        taken.bind(("127.0.0.1", 0))
        taken.listen()
        port = taken.getsockname()[1]
        code, output = worker_process("--metrics-port", str(port), "--until-empty").wait(timeout=60)
    assert code != 0
    assert f"cannot serve metrics on 127.0.0.1 port {port}" in output
    assert "Traceback" not in output


@pytest.mark.database_independent
@pytest.mark.parametrize(
    ("args", "error"),
    [
        (["--metrics-port", "65536"], "65536 is not a port number"),
        (["--metrics-port", "-1"], "-1 is not a port number"),
        (["--metrics-port", "http"], "'http' is not a port number"),
        (["--metrics-port", "9100", "--metrics-addr", "example.com"], "'example.com' is not an IP address"),
        (["--metrics-port", "9100", "--metrics-addr", "999.1.1.1"], "'999.1.1.1' is not an IP address"),
        (["--metrics-addr", "127.0.0.1", "--until-empty"], "--metrics-addr needs --metrics-port"),
    ],
)
def test_bad_metrics_options_are_refused(worker_process, args, error):
    code, output = worker_process(*args).wait(timeout=60)
    assert code != 0
    assert error in output
    assert "Traceback" not in output


@pytest.mark.database_independent
def test_multiprocess_mode_serves_every_workers_counts_from_one_port(worker_process, tmp_path):
    """prometheus-client's documented multiprocess mode: one worker serves, every worker counts."""
    env = {"PROMETHEUS_MULTIPROC_DIR": str(tmp_path)}
    transport = resolve_transport("probe.ok")
    serving = worker_process("--metrics-port", "0", "--poll-interval", "0.2", "--topics", "probe.ok", env=env)
    url = metrics_url(serving)
    other = worker_process("--poll-interval", "0.2", "--topics", "probe.other", env=env)
    for n in range(10):
        outbox.send("probe.ok", {"n": n})
    for n in range(15):
        outbox.send("probe.other", {"n": n})
    wait_for(lambda: Message.objects.filter(status="delivered").count() == 25, timeout=60)
    assert set(Delivery.objects.filter(topic="probe.other").values_list("pid", flat=True)) == {other.pid}

    def counted() -> bool:
        samples = scrape(url)
        return (
            value(samples, "outbox_messages_delivered_total", topic="probe.ok", transport=transport) == 10
            and value(samples, "outbox_messages_delivered_total", topic="probe.other", transport=transport) == 15
        )

    wait_for(counted, timeout=30)


TOPICS = 10_000


@pytest.mark.database_independent
def test_ten_thousand_topics_keep_the_scrape_bounded(worker_process):
    """A topic per tenant or per customer, without ``METRICS_TOPIC_LABELS``: every topic a series of each
    counter, for as long as the worker lives, in every scrape and in the Prometheus server's memory. The
    label values stay bounded; the topics past the bound count as ``"other"``, so no delivery goes
    uncounted, and the worker says once which setting names them."""
    outbox.send_many({"topic": f"probe.tenant-{n}", "payload": {}} for n in range(TOPICS))
    worker = worker_process(
        "--metrics-port", "0", "--poll-interval", "0.2", "--batch-size", "500", env={"OUTBOX_LOG_LEVEL": "WARNING"}
    )
    url = metrics_url(worker)
    wait_for(lambda: not Message.objects.exclude(status="delivered").exists(), timeout=240, interval=1.0)

    def delivered(samples: dict[tuple[str, frozenset[tuple[str, str]]], float]) -> float:
        return sum(v for (name, _), v in samples.items() if name == "outbox_messages_delivered_total")

    wait_for(lambda: delivered(scrape(url)) == TOPICS, timeout=30)
    with urllib.request.urlopen(url, timeout=10) as response:
        size = len(response.read())
    samples = scrape(url)
    topics = {dict(labels)["topic"] for (name, labels) in samples if name == "outbox_messages_delivered_total"}
    assert len(topics) <= MAX_TOPIC_LABELS + 1, f"{len(topics)} label values, a scrape of {size:,} bytes"
    assert "other" in topics
    assert delivered(samples) == TOPICS  # counted, every one
    assert size < 1_000_000, size
    worker.proc.send_signal(signal.SIGTERM)
    _, output = worker.wait(timeout=30)
    assert output.count("METRICS_TOPIC_LABELS") == 1, output
