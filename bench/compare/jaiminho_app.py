"""django-jaiminho (``DJANGO_SETTINGS_MODULE=bench.compare.jaiminho_settings``); its worker: ``events_relay``."""

import sys
import time

import django


def noop(n: int) -> None:
    """The no-op destination."""


if __name__ == "__main__":
    django.setup()
    from django.core.management import call_command
    from django.db import transaction
    from jaiminho.send import save_to_outbox

    from bench.compare.jaiminho_app import noop as target  # not __main__.noop: the relay loads it by path

    if sys.argv[1] == "setup":
        call_command("migrate", verbosity=0)
    else:
        send = save_to_outbox(target)
        with transaction.atomic():
            for i in range(int(sys.argv[2])):
                send(i)
        print(repr(time.time()), flush=True)
