"""Column sizes, shared by the models and by ``send()``'s validation (which must not import models)."""

TOPIC_MAX_LENGTH = 200
KEY_MAX_LENGTH = 200
IDEMPOTENCY_KEY_MAX_LENGTH = 200
WORKER_ID_MAX_LENGTH = 200
