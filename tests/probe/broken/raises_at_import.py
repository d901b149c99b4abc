"""A task module broken by a deploy: importing it raises (not an ImportError: a bad setting, a typo)."""

raise RuntimeError("tests.probe.broken.raises_at_import is broken at import")
