"""The demo's URLs plus the probe views that tests drive over HTTP."""

from django.urls import include, path
from django.views.decorators.csrf import csrf_exempt

from testproject.urls import urlpatterns as demo_urlpatterns
from tests.probe import async_views, views

urlpatterns = [
    *demo_urlpatterns,
    # Django's own password reset views: the admin tests ask for a reset as an attacker would.
    path("accounts/", include("django.contrib.auth.urls")),
    path("probe/orders/", views.create_order),
    path("probe/orders-optional/", views.create_order_optional),
    path("probe/orders-cbv/", csrf_exempt(views.OrderCreateView.as_view())),
    path("probe/orders-cbv-decorated/", csrf_exempt(views.DecoratedOrderCreateView.as_view())),
    path("probe/stream/", views.stream),
    path("probe/claim-visible/", views.claim_visible),
    path("probe/csrf/", views.csrf_token),
    path("probe/upload/", views.upload),
    path("probe/upload-plain/", views.upload_plain),
    path("probe/upload-exempt/", views.upload_exempt),
    path("probe/upload-plain-exempt/", views.upload_plain_exempt),
    path("probe/upload-to-disk/", views.upload_to_disk),
    path("probe/async-send/", async_views.async_send),
    path("probe/async-send-invalid/", async_views.async_send_invalid),
]
