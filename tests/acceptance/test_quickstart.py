"""docs/quickstart.md, run word for word in a brand-new ``startproject``.

Each block of the page is taken from the Markdown as it is: a ``python`` or ``ini`` block names its file
on its first line (``# orders/views.py``; ``(continued)``, ``(add at the end)``, ``(SQLite)`` or
``(PostgreSQL)`` appends to it, the last two only in that database's run), a ``bash`` block runs, and a
``shell`` block (installing packages) is only shown. So the page cannot drift from the code.
"""

from __future__ import annotations

import os
import re
import subprocess
import sys
import uuid
from collections.abc import Iterator
from pathlib import Path

import psycopg
import pytest
from django.conf import settings

from tests.support import IN_CI, ROOT

PAGE = ROOT / "docs" / "quickstart.md"
BLOCK = re.compile(r"^```(\w+)\n(.*?)^```", re.S | re.M)
HEADER = re.compile(r"^# (?P<path>[\w./]+)(?: \((?P<how>[^)]*)\))?\n")
PG = "postgres://postgres@127.0.0.1:5432"


def blocks() -> list[tuple[str, str]]:
    return BLOCK.findall(PAGE.read_text(encoding="utf-8"))


def run_bash(script: str, cwd: Path, env: dict[str, str]) -> str:
    done = subprocess.run(
        ["bash", "-euo", "pipefail", "-c", script], cwd=cwd, env=env, capture_output=True, text=True, timeout=180
    )
    assert done.returncode == 0, f"{script}\n--- stdout\n{done.stdout[-3000:]}\n--- stderr\n{done.stderr[-3000:]}"
    return done.stdout + done.stderr


def follow_the_page(project: Path, database: str, pg_name: str | None) -> str:
    """Every block in order, as a reader would; the whole output of the commands."""
    env = {k: v for k, v in os.environ.items() if k not in ("DJANGO_SETTINGS_MODULE", "DATABASE_URL")}
    env["PATH"] = f"{Path(sys.executable).parent}{os.pathsep}{env.get('PATH', '')}"
    output = []
    for language, text in blocks():
        if language == "shell":
            continue
        if language == "bash":
            output.append(run_bash(text, project, env))
            continue
        header = HEADER.match(text)
        assert header, f"a {language} block of the quickstart does not name its file: {text[:80]!r}"
        how = header["how"] or ""
        if how in ("SQLite", "PostgreSQL") and how.lower() != database:
            continue
        if how == "PostgreSQL":
            assert '"NAME": "mysite"' in text
            text = text.replace('"NAME": "mysite"', f'"NAME": "{pg_name}"')
        target = project / header["path"]
        target.parent.mkdir(parents=True, exist_ok=True)
        if how:
            assert target.exists(), f"the quickstart adds to {header['path']} before it exists"
            target.write_text(target.read_text(encoding="utf-8") + "\n\n" + text, encoding="utf-8")
        else:
            target.write_text(text, encoding="utf-8")
    return "\n".join(output)


@pytest.fixture
def postgres_database() -> Iterator[str]:
    name = f"quickstart_{uuid.uuid4().hex[:8]}"
    try:
        admin = psycopg.connect(f"{PG}/postgres", autocommit=True, connect_timeout=3)
    except psycopg.OperationalError as exc:
        if IN_CI:
            pytest.fail(f"PostgreSQL is not reachable ({exc}); under CI=true this is a failure")
        pytest.skip(f"PostgreSQL is not reachable: {exc}")
    with admin:
        admin.execute(f'CREATE DATABASE "{name}"')
        try:
            yield name
        finally:
            admin.execute(f'DROP DATABASE IF EXISTS "{name}" WITH (FORCE)')
            admin.execute(f'DROP DATABASE IF EXISTS "test_{name}" WITH (FORCE)')


def check_what_the_page_promises(output: str) -> None:
    assert "System check identified no issues (0 silenced)." in output
    # zero warnings: Django's system checks, Python's (a RuntimeWarning on stderr) and pytest's summary
    # ("1 passed, 1 warning") alike
    assert not re.search(r"(?i)warning", output) and "django_outbox.W" not in output, output
    assert "{'id': 1}" in output
    assert "[('book', True)]" in output
    blue, red = output.find("order 1 is now blue book"), output.find("order 1 is now red book")
    assert -1 < blue < red, output
    assert re.search(r"^1 passed in ", output, re.M), output


def test_the_quickstart_word_for_word_on_sqlite(tmp_path: Path) -> None:
    """In every Django version's SQLite cell (the project is the reader's, on a SQLite file of its own)."""
    if settings.DATABASES["default"]["ENGINE"] != "django.db.backends.sqlite3":
        pytest.skip("run in the SQLite cells")
    check_what_the_page_promises(follow_the_page(tmp_path, "sqlite", None))


@pytest.mark.slow
@pytest.mark.usefixtures("postgres")  # the page's project has a database of its own: the PostgreSQL cells' run
def test_the_quickstart_word_for_word_on_postgresql(tmp_path: Path, postgres_database: str) -> None:
    check_what_the_page_promises(follow_the_page(tmp_path, "postgresql", postgres_database))


def test_every_block_is_followed() -> None:
    """The page has the blocks this test knows how to follow, and no other kind."""
    languages = [language for language, _ in blocks()]
    assert set(languages) <= {"bash", "shell", "python", "ini"}, languages
    assert languages.count("python") >= 8 and languages.count("bash") >= 4


def test_the_first_message_has_no_key_and_keys_come_with_their_cost():
    """Keyed messages cost latency (docs/ordering.md): the page sends without a key first, then says what a
    key costs and when to use one."""
    sends = [line for _, text in blocks() for line in text.splitlines() if "outbox.send(" in line]
    assert sends and "key=" not in sends[0], sends
    assert any("key=" in line for line in sends[1:]), "the page shows a keyed message too"
    keys = PAGE.read_text(encoding="utf-8").split("## 6. When order matters: keys", 1)[1].split("\n## ", 1)[0]
    assert "The cost:" in keys and "Use a key when the consumer needs the order" in keys
