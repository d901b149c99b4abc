from django.apps import AppConfig


class ChaosConsumerConfig(AppConfig):
    name = "bench.chaos_consumer"
    label = "chaos_consumer"
    default_auto_field = "django.db.models.BigAutoField"
