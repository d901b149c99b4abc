"""django-jaiminho with a no-op event function, for the drain comparison.

    DJANGO_SETTINGS_MODULE=bench.compare.jaiminho_settings python -m bench.compare.jaiminho_app migrate|fill N

The worker is jaiminho's own ``events_relay --run-in-loop`` command. ``fill`` saves N events to its
outbox in one transaction and prints the time right after it committed.
"""

from __future__ import annotations

import sys
import time

import django


def noop(n: int) -> None:
    """The no-op destination."""


def main() -> None:
    django.setup()
    from django.core.management import call_command
    from django.db import transaction
    from jaiminho.send import save_to_outbox

    from bench.compare.jaiminho_app import noop as target  # not __main__.noop: the relay loads it by path

    send = save_to_outbox(target)
    command = sys.argv[1]
    if command == "migrate":
        call_command("migrate", verbosity=0)
    elif command == "fill":
        with transaction.atomic():
            for i in range(int(sys.argv[2])):
                send(i)
        print(repr(time.time()), flush=True)


if __name__ == "__main__":
    main()
