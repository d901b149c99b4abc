"""django-tasks (database backend) with a no-op task, for the drain comparison.

    DJANGO_SETTINGS_MODULE=bench.compare.tasks_settings python -m bench.compare.django_tasks_app migrate|fill N

The worker is the backend's own ``db_worker`` command. ``fill`` enqueues N tasks in one transaction and
prints the time right after it committed.
"""

from __future__ import annotations

import sys
import time

import django
from django_tasks import task


@task()
def noop(n: int) -> None:
    """The no-op task."""


def main() -> None:
    django.setup()
    from django.core.management import call_command
    from django.db import transaction

    from bench.compare.django_tasks_app import noop as task  # not __main__.noop: the worker imports it by path

    command = sys.argv[1]
    if command == "migrate":
        call_command("migrate", verbosity=0)
    elif command == "fill":
        with transaction.atomic():
            for i in range(int(sys.argv[2])):
                task.enqueue(i)
        print(repr(time.time()), flush=True)


if __name__ == "__main__":
    main()
