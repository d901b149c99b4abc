"""``django_outbox.__version__`` is the one source of the version: the package's metadata reads it."""

from __future__ import annotations

import importlib.metadata
import re
import tomllib

import pytest

import django_outbox
from tests.support import ROOT


def test_the_version_is_a_release_number():
    assert re.fullmatch(r"\d+\.\d+\.\d+((a|b|rc)\d+)?(\.dev\d+)?", django_outbox.__version__)


def test_pyproject_takes_its_version_from_the_package():
    pyproject = tomllib.loads((ROOT / "pyproject.toml").read_text(encoding="utf-8"))
    assert "version" not in pyproject["project"], "a second copy of the version would drift"
    assert "version" in pyproject["project"]["dynamic"]
    assert pyproject["tool"]["hatch"]["version"]["path"] == "django_outbox/__init__.py"


def test_the_installed_metadata_agrees():
    try:
        installed = importlib.metadata.version("django-transactional-outbox")
    except importlib.metadata.PackageNotFoundError:
        pytest.skip("the project is not installed here (only on PYTHONPATH)")
    assert installed == django_outbox.__version__
