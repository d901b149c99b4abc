#!/usr/bin/env bash
# The comparison environment: procrastinate, django-tasks-db, pgqueuer and django-jaiminho from the package registry, in a virtualenv
# of their own (bench/.venv-compare), never in the project's. bench/run.py finds it there by default.
set -euo pipefail
cd "$(dirname "$0")"
python3 -m venv .venv-compare
.venv-compare/bin/pip install --quiet --upgrade pip
.venv-compare/bin/pip install --quiet procrastinate django-tasks django-tasks-db pgqueuer django-jaiminho "django>=5.2,<7" "psycopg[binary]"
.venv-compare/bin/pip list 2>/dev/null | grep -iE "^(procrastinate|django|django-tasks|django-tasks-db|pgqueuer|django-jaiminho|psycopg) "
