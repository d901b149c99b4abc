from django.contrib import admin
from django.urls import include, path

from testproject.shop import views

urlpatterns = [
    path("admin/", admin.site.urls),
    path("outbox/", include("django_outbox.urls")),
    path("orders/", views.place_order, name="place-order"),
    path("orders/<int:pk>/cancel/", views.cancel_order, name="cancel-order"),
]
