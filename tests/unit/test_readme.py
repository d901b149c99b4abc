"""The README's first screen, in the order a new user needs it.

What the project is and what it guarantees, then how to install it while it is not on the package index
(from a checkout, or a wheel built from one: the commands were tried in fresh virtualenvs), with the
psycopg variant that brings a libpq named, then the two commands that run it. The contributor commands
come after. The wheel's file name carries the version, so a release that forgets the README fails here.
"""

from __future__ import annotations

import re

import django_outbox
from tests.support import ROOT

README = (ROOT / "README.md").read_text(encoding="utf-8")
BLOCK = re.compile(r"^```(\w+)\n(.*?)^```", re.S | re.M)


def section(title: str) -> str:
    start = README.index(f"\n## {title}\n")
    end = README.find("\n## ", start + 1)
    return README[start : end if end != -1 else len(README)]


def test_it_opens_with_what_it_is_and_what_it_guarantees_in_three_lines():
    head = README[: README.index("\n## ")]
    title, _, opening = head.partition("\n\n")
    assert title.startswith("# ")
    lines = opening.strip().splitlines()
    assert len(lines) <= 3, lines
    text = " ".join(lines)
    assert "same database transaction" in text and "at least once" in text, text


def test_install_comes_first_and_the_contributor_commands_after_it():
    titles = re.findall(r"^## (.+)$", README, re.M)
    assert titles[0] == "Install", titles
    assert titles.index("Install") < titles.index("Try it, test it"), titles
    assert "dev.py" not in README[: README.index("\n## Try it")]


def test_install_from_a_checkout_or_a_wheel_with_a_libpq_named():
    install = section("Install")
    commands = BLOCK.findall(install)[0][1].splitlines()
    pip = [c for c in commands if c.startswith("pip ")]
    wheel = f"dist/django_transactional_outbox-{django_outbox.__version__}-py3-none-any.whl"
    assert pip == [
        'pip install "./django-transactional-outbox[postgres]" "psycopg[binary]"',
        "pip wheel --no-deps -w dist ./django-transactional-outbox",
        f'pip install "{wheel}[postgres]" "psycopg[binary]"',
    ], pip
    assert '"psycopg[binary]"' in install and '"psycopg[c]"' in install
    # Not published yet: no line installs it from the package index by name.
    assert not re.search(r'pip install "?django-transactional-outbox', README)


def test_the_two_commands_follow_the_install():
    blocks = BLOCK.findall(section("Install"))
    assert blocks[-1] == ("bash", "python manage.py migrate\npython manage.py outbox_worker\n"), blocks[-1]


def test_the_first_example_sends_without_a_key():
    """Keyed messages cost latency (docs/ordering.md): the example a reader copies first has no key,
    as the quickstart's."""
    use = section("Use")
    first_send = next(line for line in use.splitlines() if "outbox.send(" in line)
    assert "key=" not in first_send, first_send
    assert "ordering.md" in use
