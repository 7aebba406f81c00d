"""Domain errors with a stable machine code and a sentence a person can act on, and the savepoint that
turns a unique violation into one."""

from __future__ import annotations

from django.db import IntegrityError, models, transaction


class DomainError(Exception):
    """A rule of the domain refused a change. Views turn it into JSON with `code`."""

    status = 400

    def __init__(self, code: str, detail: str, *, field: str | None = None, status: int | None = None,
                 retry_after_s: int | None = None) -> None:
        super().__init__(detail)
        self.code = code
        self.detail = detail
        self.field = field
        self.retry_after_s = retry_after_s  # sent as Retry-After (a 429 or 503)
        if status is not None:
            self.status = status


class Conflict(DomainError):
    status = 409


class NotFoundError(DomainError):
    """The object a URL names does not exist for the caller (missing and foreign alike): 404."""

    status = 404

    def __init__(self, detail: str = "Not found.", *, field: str | None = None) -> None:
        super().__init__("not_found", detail, field=field)


class DoesNotExist(DomainError):
    """A reference in the request body names nothing the caller may use: 400, the same code DRF's relation
    fields give (`does_not_exist`), so a service-level check and a field-level one read alike."""

    def __init__(self, detail: str, *, field: str) -> None:
        super().__init__("does_not_exist", detail, field=field)


def save_or_conflict(obj: models.Model, conflict: Conflict) -> None:
    """Save `obj` in a savepoint; a unique constraint it hits raises `conflict` (the service's own code and
    sentence) instead of a 500, and leaves the caller's transaction usable. The one place a service turns
    IntegrityError into a Conflict; what a service does not catch, the API maps centrally
    (apps.core.api.errors._database_refused)."""
    try:
        with transaction.atomic():
            obj.save()
    except IntegrityError as exc:
        raise conflict from exc


def _redis_errors() -> tuple[type[BaseException], ...]:
    try:
        from redis.exceptions import ConnectionError as RedisConnectionError
        from redis.exceptions import TimeoutError as RedisTimeoutError
    except ImportError:  # no Redis client installed: nothing of it can fail
        return ()
    return (RedisConnectionError, RedisTimeoutError)


# Redis (broker and cache) out of reach: a 503 for a request (api/errors.py), a task left to its safety net (enqueue).
REDIS_ERRORS = _redis_errors()
