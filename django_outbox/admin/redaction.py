"""What a console user may see of a message, and the audit log of every time content is shown.

``view_*`` permissions show the outbox as an operator works with it: topic, key, status, attempts,
errors, schedule, an email's subject, sender, To and Cc, attachment names. Whatever can hand out a
secret is *content* and needs ``django_outbox.view_message_content``: an email's body, HTML,
attachments, Bcc list and secret headers, the payload of a topic listed in
``OUTBOX["SENSITIVE_TOPICS"]``, and the value of any secret-looking header. A password-reset link
read in the admin is an account takeover, so email content is protected whatever the settings say.

Each time content is shown to a user who holds the permission, one record goes to the
``django_outbox.audit`` logger (who, which message, when), so reading a reset link leaves a trace.
Error texts stay visible to every operator, with the hidden strings masked out: a handler, an SMTP
server or a webhook receiver that quotes the content in its error must not leak it through the log.
"""

from __future__ import annotations

import functools
import logging
import re
from collections.abc import Iterable, Iterator
from dataclasses import dataclass
from typing import Any

from django.utils import timezone

from ..conf import EMAIL_TOPIC, get_settings
from ..mail.password_reset import PASSWORD_RESET
from ..routing import matches

CONTENT_PERMISSION = "django_outbox.view_message_content"
AUDIT_LOGGER = "django_outbox.audit"
audit_log = logging.getLogger(AUDIT_LOGGER)

#: What a view-only user sees in place of content.
HIDDEN = "[hidden: needs the view_message_content permission]"
#: What replaces a hidden string inside an error text.
MASK = "[hidden]"

# Why a message's content is protected (the audit records' ``reason``).
EMAIL = "email"
SENSITIVE_TOPIC = "sensitive topic"
SECRET_HEADER = "secret header"

_SECRET_HEADER = re.compile(
    r"auth|cookie|token|secret|passw|signature|credential|session|api[-_]?key|private|unsubscribe", re.IGNORECASE
)
#: Runs of this many word characters or more in hidden content are masked wherever an error repeats them.
_MIN_WORD = 8
_WORD = re.compile(rf"[\w.@+%~-]{{{_MIN_WORD},}}")  # not "=": "token=<secret>" is two words
_EDGES = ".@+%~-_"  # punctuation that ends a sentence or joins a word to its neighbours
#: Other hidden values are masked when repeated whole, from this length (Bcc addresses always) up to the next.
_MIN_EXACT = 4
_MAX_EXACT = 64


def can_view_content(user: Any) -> bool:
    return bool(user.has_perm(CONTENT_PERMISSION))


def is_secret_header(name: object) -> bool:
    return _SECRET_HEADER.search(str(name)) is not None


def is_sensitive_topic(topic: str) -> bool:
    return any(matches(pattern, topic) for pattern in get_settings().SENSITIVE_TOPICS)


def protects_topic(topic: str) -> bool:
    """Whether every message of ``topic`` has content a view-only user may not see."""
    return topic == EMAIL_TOPIC or is_sensitive_topic(topic)


def protection(topic: str, payload: object, headers: object) -> str | None:
    """Why this message's content needs the permission, or None when a view-only user may see all of it."""
    if topic == EMAIL_TOPIC:
        if isinstance(payload, dict) and payload.get("protected") == PASSWORD_RESET:
            return PASSWORD_RESET
        return EMAIL
    if is_sensitive_topic(topic):
        return SENSITIVE_TOPIC
    if isinstance(headers, dict) and any(is_secret_header(name) for name in headers):
        return SECRET_HEADER
    return None


@dataclass(frozen=True, kw_only=True)
class Disclosure:
    """What one request may see of one message: built per request, used by every field of its page."""

    topic: str
    payload: Any
    headers: Any
    reason: str | None
    allowed: bool

    @classmethod
    def of(cls, obj: Any, user: Any) -> Disclosure:
        payload, headers = obj.payload, obj.headers
        return cls(
            topic=obj.topic,
            payload=payload,
            headers=headers,
            reason=protection(obj.topic, payload, headers),
            allowed=can_view_content(user),
        )

    @property
    def reveals(self) -> bool:
        """Whether the page shows this user something a view-only user would not see."""
        return self.allowed and self.reason is not None

    def shown_payload(self) -> Any:
        if self.allowed or self.reason is None:
            return self.payload
        if self.topic == EMAIL_TOPIC:
            return email_outline(self.payload)
        if self.reason == SENSITIVE_TOPIC:
            return HIDDEN
        return self.payload  # only a header is secret

    def shown_headers(self) -> Any:
        if self.allowed or not isinstance(self.headers, dict):
            return self.headers
        return {name: HIDDEN if is_secret_header(name) else value for name, value in self.headers.items()}

    def shown_error(self, text: str) -> str:
        if self.allowed or self.reason is None or not text:
            return text
        masked = self._masked.get(text)
        if masked is None:  # a retried message repeats its error: mask each text once
            masked = self._masked[text] = mask(text, self._hidden)
        return masked

    @functools.cached_property
    def _hidden(self) -> _Hidden:
        return _index(hidden_strings(self.topic, self.payload, self.headers, self.reason))

    @functools.cached_property
    def _masked(self) -> dict[str, str]:
        return {}


def email_outline(payload: object) -> dict[str, Any]:
    """An email as a view-only user sees it: who, what subject, which attachments; no content, no Bcc."""
    if not isinstance(payload, dict):
        return {"content": HIDDEN}
    shown: dict[str, Any] = {
        key: payload[key]
        for key in ("format", "subject", "from_email", "to", "cc", "reply_to", "content_subtype", "protected")
        if key in payload
    }
    shown["body"] = HIDDEN
    bcc = payload.get("bcc") or []
    shown["bcc"] = f"[{len(bcc)} hidden]" if bcc else []
    shown["headers"] = [
        [name, HIDDEN if is_secret_header(name) else value] for name, value in _pairs(payload.get("headers"))
    ]
    shown["alternatives"] = [
        {"mimetype": a.get("mimetype"), "content": HIDDEN} for a in _dicts(payload.get("alternatives"))
    ]
    shown["attachments"] = [
        {"filename": a.get("filename"), "mimetype": a.get("mimetype", "MIME part"), "content": HIDDEN}
        for a in _dicts(payload.get("attachments"))
    ]
    return shown


def email_recipients(payload: object, *, bcc: bool) -> list[str]:
    if not isinstance(payload, dict):
        return []
    keys = ("to", "cc", "bcc") if bcc else ("to", "cc")
    return [str(address) for key in keys for address in payload.get(key) or []]


def hidden_strings(topic: str, payload: object, headers: object, reason: str | None) -> list[str]:
    """Every string of the message a view-only user may not see, for masking error texts."""
    found: list[str] = []
    if isinstance(headers, dict):
        found += [str(value) for name, value in headers.items() if is_secret_header(name)]
    if reason in (EMAIL, PASSWORD_RESET) and isinstance(payload, dict):
        found.append(str(payload.get("body", "")))
        found += [str(a) for a in payload.get("bcc") or []]
        found += [str(value) for name, value in _pairs(payload.get("headers")) if is_secret_header(name)]
        for part in (*_dicts(payload.get("alternatives")), *_dicts(payload.get("attachments"))):
            found += [str(part[k]) for k in ("content", "content_b64", "mime_b64") if k in part]
    elif reason == SENSITIVE_TOPIC:
        found += list(_leaves(payload))
    return found


@dataclass(frozen=True)
class _Hidden:
    words: frozenset[str]  # runs of _MIN_WORD+ word characters found in the hidden content
    whole: frozenset[str]  # short hidden values that are not one such run (a PIN, "a@b.io", "4 Elm St")
    lengths: tuple[int, ...]  # of the ``whole`` values, longest first
    starts: frozenset[str]  # their first two characters: most positions of a text are ruled out at once


def _index(strings: Iterable[str]) -> _Hidden:
    words: set[str] = set()
    whole: set[str] = set()
    for text in strings:
        for word in _WORD.findall(text):
            words.update((word, word.strip(_EDGES)))
        short_enough = (len(text) >= _MIN_EXACT or "@" in text) and len(text) <= _MAX_EXACT
        if short_enough and _WORD.fullmatch(text) is None:
            whole.add(text)
    lengths = tuple(sorted({len(t) for t in whole}, reverse=True))
    return _Hidden(frozenset(words), frozenset(whole), lengths, frozenset(t[:2] for t in whole))


def mask(text: str, hidden: _Hidden) -> str:
    """``text`` with every hidden string it repeats, whole or as a long enough word, replaced by MASK.

    Whole values are looked up at each token start for each length they come in (at most _MAX_EXACT
    lookups per position), so the cost does not grow with the number of hidden values.
    """
    if hidden.whole:
        out: list[str] = []
        i, n = 0, len(text)
        while i < n:
            if text[i : i + 2] in hidden.starts and (i == 0 or not (text[i - 1].isalnum() and text[i].isalnum())):
                found = next((length for length in hidden.lengths if text[i : i + length] in hidden.whole), 0)
                if found:
                    out.append(MASK)
                    i += found
                    continue
            out.append(text[i])
            i += 1
        text = "".join(out)
    if not hidden.words:
        return text

    def word(match: re.Match[str]) -> str:
        found = match.group(0)
        if found in hidden.words:
            return MASK
        core = found.strip(_EDGES)  # "4242424242424242." at the end of a sentence
        return found.replace(core, MASK, 1) if core and core in hidden.words else found

    return _WORD.sub(word, text)


def _leaves(value: object) -> Iterator[str]:
    """The strings and long integers of a JSON document, without recursion (payloads may nest deeply)."""
    stack = [value]
    while stack:
        item = stack.pop()
        if isinstance(item, dict):
            stack.extend(item.values())
        elif isinstance(item, list):
            stack.extend(item)
        elif isinstance(item, str):
            yield item
        elif isinstance(item, int) and not isinstance(item, bool) and abs(item) >= 1000:
            yield str(item)


def _dicts(value: object) -> list[dict[str, Any]]:
    return [item for item in value if isinstance(item, dict)] if isinstance(value, list) else []


def _pairs(value: object) -> list[tuple[object, object]]:
    if not isinstance(value, list):
        return []
    return [(item[0], item[1]) for item in value if isinstance(item, list | tuple) and len(item) == 2]


def log_reveal(request: Any, obj: Any, disclosure: Disclosure, *, view: str) -> None:
    """One audit record: this user was shown this message's protected content, now."""
    user = request.user
    when = timezone.now()
    username = user.get_username()
    audit_log.info(
        "outbox message %s (%s, %s) content shown to %s (id %s) on the %s page",
        obj.pk,
        obj.topic,
        disclosure.reason,
        username,
        user.pk,
        view,
        extra={
            "user": username,
            "user_id": user.pk,
            "message_id": obj.pk,
            "message_uuid": str(obj.uuid),
            "topic": obj.topic,
            "reason": disclosure.reason,
            "view": view,
            "revealed_at": when.isoformat(),
            "remote_addr": request.META.get("REMOTE_ADDR"),
        },
    )
