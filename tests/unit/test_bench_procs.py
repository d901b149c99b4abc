"""The benchmark's process helper stops a worker with one SIGTERM: a second one tells ``outbox_worker`` to stop
at once with its deliveries in progress, an error line the migrations benchmark counts against the run."""

from __future__ import annotations

import signal
import sys
from typing import Any

from bench import procs

WAITS = "import time; print('ready', flush=True); time.sleep(60)"


def test_stopping_several_processes_signals_each_once(monkeypatch: Any) -> None:
    started = [procs.Proc([sys.executable, "-c", WAITS]) for _ in range(2)]
    sent: list[tuple[int, int]] = []
    for p in started:
        p.wait_for_line("ready", timeout=20)

        def counted(signum: int, p: procs.Proc = p, deliver: Any = p.proc.send_signal) -> None:
            sent.append((started.index(p), signum))
            deliver(signum)

        monkeypatch.setattr(p.proc, "send_signal", counted)
    procs.stop_all(started)
    assert sent == [(0, signal.SIGTERM), (1, signal.SIGTERM)]
    assert [p.proc.returncode for p in started] == [-signal.SIGTERM, -signal.SIGTERM]
