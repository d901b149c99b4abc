"""Task modules that no longer import, for the tasks backend's tests: each fails at import in its own way.

Nothing imports them but the code under test, when a task message names one of their tasks.
"""
