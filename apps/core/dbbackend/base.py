"""Django's PostgreSQL backend, whose connection health check sends nothing while the connection is idle.

With CONN_HEALTH_CHECKS (settings: a kept connection PostgreSQL dropped must not fail the next request) Django
sends `SELECT 1` before the first query of every request and every Celery task: one round trip each, on every
API call's path and every reconcile's (py-spy, bench-scale at 100k routes: 9% of the web process's request time,
the token lookup's first query waiting on it). A connection PostgreSQL closed (restarted, failed over, the
backend terminated) has the server's last message or its end of stream waiting on the socket, while an idle
healthy one has nothing to read: so an idle connection with an empty socket is usable as it is, and anything
else (data waiting, a transaction open or failed, a socket error) is asked with `SELECT 1` as before.
"""

from __future__ import annotations

import select

from django.db.backends.postgresql import base
from psycopg import pq

_IDLE = pq.TransactionStatus.IDLE
_WAITING = select.POLLIN | select.POLLPRI | select.POLLERR | select.POLLHUP


class DatabaseWrapper(base.DatabaseWrapper):
    def is_usable(self) -> bool:
        conn = self.connection
        if conn is None or conn.closed or conn.broken:
            return False
        if conn.info.transaction_status == _IDLE:
            try:
                poller = select.poll()
                poller.register(conn.fileno(), _WAITING)
                waiting = poller.poll(0)
            except (OSError, ValueError):
                return False
            if not waiting:
                return True
        return super().is_usable()
