from django.apps import AppConfig


class NoopConfig(AppConfig):
    name = "bench.noop"
    label = "bench_noop"
