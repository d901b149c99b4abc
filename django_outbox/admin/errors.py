"""An error's one-line summary, as every outbox page and ``outbox_status`` write it.

Apart from ``display``: ``outbox_status`` and the overview's figures serve projects without
``django.contrib.admin`` too, so this imports nothing of Django's.
"""

from __future__ import annotations

import re

#: A stored traceback's frame lines; the exception's own line is the first unindented one after them.
_FRAME = re.compile(r"^(\s+|Traceback\b)")
#: How ``traceback.format_exception`` opens a block: a plain traceback, or a top-level exception group's
#: (whose lines then carry a "  | " margin; ``describe_error`` strips the first line's two spaces).
_HEADERS = ("Traceback (most recent call last):", "+ Exception Group Traceback (most recent call last):")
_GROUP_MARGIN = "  | "
#: The unindented lines between a chain's blocks: the last block is the exception that was raised.
_CHAIN_SEPARATORS = (
    "The above exception was the direct cause of the following exception:",
    "During handling of the above exception, another exception occurred:",
)


def error_summary(text: str) -> str:
    """The line an operator reads first: the exception's type and message (``RuntimeError: warehouse is
    down``), not the library frames a traceback opens with.

    The worker stores ``traceback.format_exception`` text: the last block of a chain is the exception
    raised, and its first unindented line after the frames is that exception's line (the rest of a
    multi-line message, indented or not, and its notes follow). Errors written without a traceback (a
    lease that expired, a cancel's reason), or a traceback cut to its tail, are summed up as before.
    """
    lines = [line for line in text.strip().splitlines() if line.strip() and line.strip() != "..."]
    found = _exception_line(lines)
    if found is not None:
        return found
    last_frame = max((i for i, line in enumerate(lines) if _FRAME.match(line)), default=None)
    if last_frame is None:
        return lines[-1].strip() if lines else ""
    after = lines[last_frame + 1 :]
    return after[0].strip() if after else lines[last_frame].strip()


def _exception_line(lines: list[str]) -> str | None:
    """The raised exception's own line, read from the last block of a whole traceback; None without one."""
    start = max((i + 1 for i, line in enumerate(lines) if line in _CHAIN_SEPARATORS), default=0)
    if start >= len(lines) or lines[start].strip() not in _HEADERS:
        return None
    group = lines[start].strip() != _HEADERS[0]
    for line in lines[start + 1 :]:
        if group:
            if not line.startswith(_GROUP_MARGIN):
                return None  # the group's own line comes before its sub-exceptions ("  +-+---- 1 ----")
            line = line[len(_GROUP_MARGIN) :]
        if not line[:1].isspace():
            return line.strip()
    return None
