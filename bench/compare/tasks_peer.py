"""The peer workload of bench/tasks.py, for either system (``DJANGO_SETTINGS_MODULE`` picks it).

    python -m bench.compare.tasks_peer migrate|fill N

``fill`` writes N business rows, each with its task enqueued beside it, in one committed transaction, and
prints the time right after the commit.
"""

import sys
import time

import django

if __name__ == "__main__":
    django.setup()
    from django.core.management import call_command
    from django.db import connection, transaction

    from bench.compare.peer_tasks import noop

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
                noop.enqueue(i)
        print(repr(time.time()), flush=True)
