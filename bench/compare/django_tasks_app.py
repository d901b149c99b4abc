"""django-tasks with django-tasks-db (``DJANGO_SETTINGS_MODULE=bench.compare.tasks_settings``); its worker:
``db_worker``."""

import sys
import time

import django
from django_tasks import task


@task()
def noop(n: int) -> None:
    """The no-op task."""


if __name__ == "__main__":
    django.setup()
    from django.core.management import call_command
    from django.db import transaction

    from bench.compare.django_tasks_app import noop as job  # not __main__.noop: the worker imports it by path

    if sys.argv[1] == "setup":
        call_command("migrate", verbosity=0)
    else:
        with transaction.atomic():
            for i in range(int(sys.argv[2])):
                job.enqueue(i)
        print(repr(time.time()), flush=True)
