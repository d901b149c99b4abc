"""The chaos run's consumer: an outbox handler that applies each message's effect through the inbox.

See bench/chaos.py and docs/reliability.md ("Count the nines").
"""
