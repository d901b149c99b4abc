"""Settings of the demo shop. SQLite unless DATABASE_URL is set (e.g. postgres://postgres@127.0.0.1/test)."""

from pathlib import Path

import django
import environ

BASE_DIR = Path(__file__).resolve().parent.parent
env = environ.Env(DEBUG=(bool, True))

SECRET_KEY = env("SECRET_KEY", default="demo-only-not-secret")
DEBUG = env("DEBUG")
ALLOWED_HOSTS = env.list("ALLOWED_HOSTS", default=["localhost", "127.0.0.1", "testserver"])

INSTALLED_APPS = [
    "django.contrib.admin",
    "django.contrib.auth",
    "django.contrib.contenttypes",
    "django.contrib.sessions",
    "django.contrib.messages",
    "django.contrib.staticfiles",
    "django_outbox",
    "testproject.shop",
]

MIDDLEWARE = [
    "django.middleware.security.SecurityMiddleware",
    "django.contrib.sessions.middleware.SessionMiddleware",
    "django.middleware.common.CommonMiddleware",
    "django.middleware.csrf.CsrfViewMiddleware",
    "django.contrib.auth.middleware.AuthenticationMiddleware",
    "django.contrib.messages.middleware.MessageMiddleware",
    "django.middleware.clickjacking.XFrameOptionsMiddleware",
]

ROOT_URLCONF = "testproject.urls"
TEMPLATES = [
    {
        "BACKEND": "django.template.backends.django.DjangoTemplates",
        "DIRS": [],
        "APP_DIRS": True,
        "OPTIONS": {
            "context_processors": [
                "django.template.context_processors.request",
                "django.contrib.auth.context_processors.auth",
                "django.contrib.messages.context_processors.messages",
            ],
        },
    },
]
WSGI_APPLICATION = "testproject.wsgi.application"

SQLITE_PATH = env("SQLITE_PATH", default=str(BASE_DIR / "demo.sqlite3"))
DATABASES = {"default": env.db_url_config(env.str("DATABASE_URL", default="") or f"sqlite:///{SQLITE_PATH}")}
if DATABASES["default"]["ENGINE"] == "django.db.backends.sqlite3":
    # WAL and immediate transactions let a worker and the web process write side by side.
    DATABASES["default"].setdefault("OPTIONS", {}).update(
        {"transaction_mode": "IMMEDIATE", "timeout": 20, "init_command": "PRAGMA journal_mode=WAL;"}
    )
    # A file, not memory, so that worker processes started by the tests see the test database.
    DATABASES["default"]["TEST"] = {"NAME": env("SQLITE_TEST_PATH", default=str(BASE_DIR / "test.sqlite3"))}

if DATABASES["default"]["ENGINE"] == "django.db.backends.mysql":
    # utf8mb4: four-byte characters (emoji) in payloads, keys and errors; the test database made so too.
    DATABASES["default"].setdefault("OPTIONS", {}).setdefault("charset", "utf8mb4")
    DATABASES["default"]["TEST"] = {"CHARSET": "utf8mb4", "COLLATION": "utf8mb4_unicode_ci"}

DEFAULT_AUTO_FIELD = "django.db.models.BigAutoField"
USE_TZ = True
TIME_ZONE = "UTC"
LANGUAGE_CODE = "en-us"
STATIC_URL = "static/"

# The shop sends its order events to its own webhook endpoint (as another service would receive them),
# emails through the outbox, and handles cancellations with a local handler (shop/outbox.py).
SHOP_WEBHOOK_SECRET = env("SHOP_WEBHOOK_SECRET", default="whsec_ZGVtby13ZWJob29rLXNlY3JldC1ub3QtZm9yLXByb2R1Y3Rpb24=")
SHOP_WEBHOOK_URL = env("SHOP_WEBHOOK_URL", default="http://127.0.0.1:8000/webhooks/orders/")
DEMO_MAIL_DIR = env("DEMO_MAIL_DIR", default=str(BASE_DIR / "demo-mail"))
DEFAULT_FROM_EMAIL = "shop@example.com"
_FILE_EMAIL_BACKEND = "django.core.mail.backends.filebased.EmailBackend"  # the demo's "real" mail server

OUTBOX = {
    "MAX_ATTEMPTS": env.int("OUTBOX_MAX_ATTEMPTS", default=5),
    "BACKOFF_BASE_SECONDS": env.float("OUTBOX_BACKOFF_BASE_SECONDS", default=1.0),
    "POLL_INTERVAL_SECONDS": env.float("OUTBOX_POLL_INTERVAL_SECONDS", default=1.0),
    "TRANSPORTS": {
        "shop-webhooks": {
            "BACKEND": "django_outbox.transports.webhook.WebhookTransport",
            "OPTIONS": {
                "URL": SHOP_WEBHOOK_URL,
                "SECRET": SHOP_WEBHOOK_SECRET,
                "TIMEOUT": 10,
                # The demo posts to itself on loopback, which the SSRF guard refuses unless allowed.
                "ALLOWED_HOSTS": ["127.0.0.1", "localhost"],
            },
        },
    },
    "ROUTES": {"orders.created": "shop-webhooks"},
}
if django.VERSION >= (6, 1):
    MAILERS = {
        "default": {"BACKEND": "django_outbox.mail.EmailBackend"},
        "real": {"BACKEND": _FILE_EMAIL_BACKEND, "OPTIONS": {"file_path": DEMO_MAIL_DIR}},
    }
    OUTBOX["EMAIL_MAILER"] = "real"
else:
    EMAIL_BACKEND = "django_outbox.mail.EmailBackend"
    EMAIL_FILE_PATH = DEMO_MAIL_DIR
    OUTBOX["EMAIL_BACKEND"] = _FILE_EMAIL_BACKEND

LOGGING = {
    "version": 1,
    "disable_existing_loggers": False,
    "formatters": {"plain": {"format": "%(asctime)s %(levelname)s %(name)s: %(message)s"}},
    "handlers": {"console": {"class": "logging.StreamHandler", "formatter": "plain"}},
    "loggers": {"django_outbox": {"handlers": ["console"], "level": env("OUTBOX_LOG_LEVEL", default="WARNING")}},
}

# The Standard Webhooks secret the shop's webhook consumer verifies (shop/webhooks.py).
