"""The test settings plus the benchmark's no-op app, whose ``bench_idle`` command is the stop test's reference."""

from tests.settings import *  # noqa: F403

INSTALLED_APPS = [*INSTALLED_APPS, "bench.noop"]  # noqa: F405
