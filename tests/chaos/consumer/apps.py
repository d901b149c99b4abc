from django.apps import AppConfig


class ChaosConsumerConfig(AppConfig):
    name = "tests.chaos.consumer"
    label = "chaos_consumer"
    default_auto_field = "django.db.models.BigAutoField"
