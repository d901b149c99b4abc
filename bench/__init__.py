"""Benchmarks of the outbox against a hand-written relay and other Python queues (see docs/performance.md)."""
