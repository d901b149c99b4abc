"""The peers of the ``compare`` and ``tasks`` sections, run by bench/compare_setup.sh's interpreter so that their
packages never enter the project's environment: ``python -m bench.compare.<module> migrate|fill N`` makes
their tables, or commits N no-op jobs through the library's own API and prints the time after the commit."""
