"""The tests' own ASGI application (tests.settings), served by a real uvicorn process in
tests/integration/test_async_views.py."""

import os

from django.core.asgi import get_asgi_application

os.environ.setdefault("DJANGO_SETTINGS_MODULE", "tests.settings")

application = get_asgi_application()
