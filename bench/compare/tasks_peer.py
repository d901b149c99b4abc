"""The Django peers' workload: django-tasks (django-tasks-db's, or Django 6's on the outbox in bench/tasks.py)
and django-jaiminho, ``BENCH_TASKS_SYSTEM`` naming which and ``DJANGO_SETTINGS_MODULE`` its settings. ``fill
N`` commits N business rows, each with a no-op job beside it (a task enqueued, an event saved to jaiminho's
outbox), in one transaction."""

import os
import sys
import time

import django

SYSTEM = os.environ.get("BENCH_TASKS_SYSTEM", "")


def target(n: int) -> None:
    """The no-op destination of django-jaiminho's events."""


if __name__ != "__main__" and SYSTEM != "django-jaiminho":  # imported by path, after django.setup()
    if SYSTEM == "django-tasks-db":
        from django_tasks import task
    else:
        from django.tasks import task

    @task()
    def noop(n: int) -> None:
        """The no-op task."""


if __name__ == "__main__":
    django.setup()
    from django.core.management import call_command
    from django.db import connection, transaction

    from bench.compare import tasks_peer  # not __main__: the workers import the job by its path

    if SYSTEM == "django-jaiminho":
        from jaiminho.send import save_to_outbox

        enqueue = save_to_outbox(tasks_peer.target)
    else:
        enqueue = tasks_peer.noop.enqueue
    if sys.argv[1] == "migrate":
        call_command("migrate", verbosity=0)
        with connection.cursor() as cursor:
            cursor.execute("CREATE TABLE IF NOT EXISTS bench_business (id bigserial PRIMARY KEY, n integer NOT NULL)")
    else:
        with connection.cursor() as cursor:
            cursor.execute("TRUNCATE bench_business")
        with transaction.atomic(), connection.cursor() as cursor:
            for i in range(int(sys.argv[2])):
                cursor.execute("INSERT INTO bench_business (n) VALUES (%s)", [i])
                enqueue(i)
        print(repr(time.time()), flush=True)
