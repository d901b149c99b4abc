from django.contrib import admin

from .models import Notification, Order

admin.site.register(Order)
admin.site.register(Notification)
