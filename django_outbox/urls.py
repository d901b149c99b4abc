"""``path("outbox/", include("django_outbox.urls"))``: the public "view in browser" page of emails."""

from django.urls import path

from .mail.views import view_in_browser

app_name = "django_outbox"
urlpatterns = [
    path("email/<str:token>/", view_in_browser, name="email-view"),
]
