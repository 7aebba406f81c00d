from __future__ import annotations

from django.conf import settings
from django.core.management.base import BaseCommand

from apps.core.validators import validate_address_port
from apps.signals.collector import Collector
from apps.signals.directory import DatabaseDirectory


class Command(BaseCommand):
    help = "Collect the nodes' request logs into golden signals (settings.SIGNALS_LISTEN, UDP)."

    def add_arguments(self, parser) -> None:
        parser.add_argument("--listen", default=settings.SIGNALS_LISTEN, help="address:port to listen on")
        parser.add_argument("--duration", type=float, default=None, help="stop after this many seconds")

    def handle(self, *args, listen: str, duration: float | None, **options) -> None:
        directory = DatabaseDirectory()
        directory.load()
        collector = Collector(validate_address_port(listen), directory)
        self.stdout.write(f"signals: listening on {collector.address[0]}:{collector.address[1]} (udp)")
        self.stdout.flush()
        collector.run(duration_s=duration)
