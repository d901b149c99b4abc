"""Idempotent HTTP endpoints: ``@idempotent`` and ``IdempotentMixin`` honour the ``Idempotency-Key`` header.

``endpoints`` answers requests (claim, run the view, store or replay the response); ``records`` holds
every statement on the stored responses, so the HTTP side never queries. See docs/idempotency.md.
"""

from .endpoints import IdempotencyOptions, IdempotentMixin, client_scope, idempotent

__all__ = ["IdempotencyOptions", "IdempotentMixin", "client_scope", "idempotent"]
