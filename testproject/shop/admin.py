from django.contrib import admin

from .models import Notification, Order, Shipment

admin.site.register(Order)
admin.site.register(Notification)
admin.site.register(Shipment)
