"""``path("outbox/", include("django_outbox.urls"))``: the public "view in browser" page of emails, and the
``health/`` and ``metrics/`` views for probes and scrapers (staff or ``OUTBOX["HEALTH_TOKEN"]`` only)."""

from django.urls import path

from .mail.views import view_in_browser
from .observability import views as observability

app_name = "django_outbox"
urlpatterns = [
    path("email/<str:token>/", view_in_browser, name="email-view"),
    path("health/", observability.health, name="health"),
    path("metrics/", observability.metrics, name="metrics"),
]
