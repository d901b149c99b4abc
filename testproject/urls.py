from django.contrib import admin
from django.urls import include, path

from testproject.shop import views, webhooks

urlpatterns = [
    path("admin/", admin.site.urls),
    path("outbox/", include("django_outbox.urls")),
    path("orders/", views.place_order, name="place-order"),
    path("orders/<int:pk>/cancel/", views.cancel_order, name="cancel-order"),
    path("api/orders/", views.create_order_api, name="api-create-order"),
    path("webhooks/orders/", webhooks.receive_order_webhook, name="order-webhook"),
]
