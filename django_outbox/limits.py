"""Column sizes, shared by the models and by ``send()``'s validation (which must not import models)."""

TOPIC_MAX_LENGTH = 200
KEY_MAX_LENGTH = 200
IDEMPOTENCY_KEY_MAX_LENGTH = 200
WORKER_ID_MAX_LENGTH = 200
INBOX_SOURCE_MAX_LENGTH = 200
INBOX_MESSAGE_ID_MAX_LENGTH = 255
REQUEST_KEY_MAX_LENGTH = 255
REQUEST_SCOPE_MAX_LENGTH = 255
#: Deepest nesting of lists and objects in a payload. Python's JSON decoder gives up a little under
#: 1,000 levels (fewer on a worker's deeper stack), where a message would fail every claim that reads
#: it; SQLite's JSON stops at 1,000, and many consumers' parsers far earlier (serde_json at 128).
PAYLOAD_MAX_DEPTH = 100
#: Most items one ``send_many()`` takes. A batch is held whole in memory until its transaction writes it
#: (about 2 KB an item at the peak, half of it the ``Message`` objects returned): the cap keeps one call
#: within a few hundred MB, and an endless iterable from being read to exhaustion. Larger batches are
#: several calls in the same transaction, which stays atomic.
SEND_MANY_MAX_ITEMS = 100_000
