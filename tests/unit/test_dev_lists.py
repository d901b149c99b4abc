"""``dev.py``'s extra runs name test modules by path: a module moved or merged must not drop out of them."""

from __future__ import annotations

import importlib.util
import sys
from types import ModuleType

import pytest

from tests.support import ROOT


def _dev() -> ModuleType:
    spec = importlib.util.spec_from_file_location("dev", ROOT / "dev.py")
    assert spec is not None and spec.loader is not None
    module = importlib.util.module_from_spec(spec)
    sys.modules.setdefault("dev", module)  # its dataclasses look their module up there
    spec.loader.exec_module(module)
    return module


@pytest.mark.parametrize("name", ["NAIVE_TIME_TESTS", "POOLER_TESTS"])
def test_every_module_dev_py_names_exists(name):
    paths = getattr(_dev(), name)
    assert paths, f"dev.py's {name} is empty"
    missing = [path for path in paths if not (ROOT / path).is_file()]
    assert missing == [], f"dev.py's {name} names modules that do not exist: {missing}"
