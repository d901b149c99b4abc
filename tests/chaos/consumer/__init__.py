"""The chaos run's consumer: an outbox handler that applies each message's effect through the inbox.

See tests/chaos/run.py and docs/reliability.md ("Count the nines").
"""
