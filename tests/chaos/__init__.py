"""The chaos run: fault injection against real processes and servers (tests/chaos/run.py).

Not collected by pytest (no test_*.py): the test command runs it as cells of its own, and
tests/acceptance/test_chaos_consumer.py runs its smallest form.
"""
