"""The peer workload of bench/tasks.py, for either system (``DJANGO_SETTINGS_MODULE`` picks it).

    python -m bench.compare.tasks_peer migrate
    python -m bench.compare.tasks_peer fill N

``fill`` writes N business rows, each with its task enqueued beside it, in one committed transaction, and
prints the time right after the commit.
"""

from __future__ import annotations

import sys
import time

import django

BUSINESS_TABLE = "CREATE TABLE IF NOT EXISTS bench_business (id bigserial PRIMARY KEY, n integer NOT NULL)"


def main() -> None:
    django.setup()
    from django.core.management import call_command
    from django.db import connection, transaction

    from bench.compare.peer_tasks import noop

    command = sys.argv[1]
    if command == "migrate":
        call_command("migrate", verbosity=0)
        with connection.cursor() as cursor:
            cursor.execute(BUSINESS_TABLE)
    elif command == "fill":
        with connection.cursor() as cursor:
            cursor.execute("TRUNCATE bench_business")
        with transaction.atomic(), connection.cursor() as cursor:
            for i in range(int(sys.argv[2])):
                cursor.execute("INSERT INTO bench_business (n) VALUES (%s)", [i])
                noop.enqueue(i)
        print(repr(time.time()), flush=True)
    else:
        sys.exit(f"unknown command {command!r}: migrate or fill N")


if __name__ == "__main__":
    main()
