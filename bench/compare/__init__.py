"""Other Python options, run by the same harness in their own virtualenv (installed from the registry).

Nothing here is imported by the main environment: ``bench/run.py`` calls these modules with the
comparison environment's interpreter (``--compare-python``), so their packages never enter the project.
"""
