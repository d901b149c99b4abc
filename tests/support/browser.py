"""A real headless Chromium for admin tests, driven by Playwright from a thread of its own.

Playwright's sync API runs an asyncio event loop in the thread that starts it. Django's async-safety
check would then see "an event loop is running" and refuse every ORM call the test makes in that
thread. Rather than switch the check off for the whole test run (``DJANGO_ALLOW_ASYNC_UNSAFE``, which
would also hide real mistakes), the browser lives in its own thread and the test hands it functions to
run on the page; the test thread keeps a clean, loop-free ORM.

It drives the system's Chromium (``/usr/bin/chromium``, installed by ``.ci/run``): nothing is ever
downloaded.
"""

from __future__ import annotations

import queue
import threading
from collections.abc import Callable, Iterator
from concurrent.futures import Future
from pathlib import Path
from typing import Any, TypeVar

import pytest

from . import IN_CI

CHROMIUM = Path("/usr/bin/chromium")
CHROMIUM_ARGS = [
    "--headless",
    "--no-sandbox",
    "--disable-gpu",
    "--disable-quic",
    "--no-first-run",
    "--disable-background-networking",
    "--disable-component-update",
    "--disable-sync",
]
T = TypeVar("T")


class Browser:
    def __init__(self, *, width: int = 1280, height: int = 860, timeout: float = 60) -> None:
        self.timeout = timeout
        self.dialogs: list[str] = []
        self._calls: queue.Queue[tuple[Callable[[Any], Any], Future[Any]] | None] = queue.Queue()
        self._started: Future[None] = Future()
        self._thread = threading.Thread(target=self._serve, args=(width, height), name="browser", daemon=True)
        self._thread.start()
        self._started.result(timeout=timeout)

    def _serve(self, width: int, height: int) -> None:
        from playwright.sync_api import sync_playwright

        try:
            with sync_playwright() as playwright:
                browser = playwright.chromium.launch(executable_path=str(CHROMIUM), args=CHROMIUM_ARGS)
                page = browser.new_page(viewport={"width": width, "height": height})
                page.set_default_timeout(15_000)
                page.on("dialog", self._dialog)
                self._started.set_result(None)
                while (call := self._calls.get()) is not None:
                    func, result = call
                    try:
                        result.set_result(func(page))
                    except BaseException as exc:
                        result.set_exception(exc)
                browser.close()
        except BaseException as exc:
            if not self._started.done():
                self._started.set_exception(exc)
            raise

    def _dialog(self, dialog: Any) -> None:
        """A page script that runs ``alert()`` shows up here: the XSS tests expect none."""
        self.dialogs.append(dialog.message)
        dialog.dismiss()

    def __call__(self, func: Callable[[Any], T]) -> T:
        """Run ``func(page)`` in the browser thread and return its result (or raise its exception)."""
        result: Future[T] = Future()
        self._calls.put((func, result))
        return result.result(timeout=self.timeout)

    def close(self) -> None:
        self._calls.put(None)
        self._thread.join(timeout=self.timeout)


@pytest.fixture
def browser() -> Iterator[Browser]:
    missing = None
    if not CHROMIUM.exists():
        missing = f"{CHROMIUM} is not installed (apt-get install chromium; .ci/run does it)"
    else:
        try:
            import playwright  # noqa: F401
        except ImportError:
            missing = "the playwright package is not installed (pip install --group test, as python3 dev.py does)"
    if missing:
        if IN_CI:
            pytest.fail(f"{missing}; under CI=true this is a failure")
        pytest.skip(missing)
    browser = Browser(width=1600, height=900)
    yield browser
    browser.close()
