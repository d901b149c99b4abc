"""The peers of the ``compare`` and ``tasks`` sections, run from a virtualenv of their own (bench/compare_setup.sh)
by its interpreter, so that their packages never enter the project's.

Each peer's module (``<peer>_app``, or ``tasks_peer`` for the Django ones), ``python -m bench.compare.<module>
migrate|fill N`` with ``BENCH_COMPARE_DSN`` set, makes its tables, or commits N no-op jobs through the
library's own API in one transaction and prints the time right after the commit; each peer drains them with
its own worker command and defaults.
"""
