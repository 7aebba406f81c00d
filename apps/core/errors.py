"""Domain errors with a stable machine code and a sentence a person can act on."""

from __future__ import annotations


class DomainError(Exception):
    """A rule of the domain refused a change. Views turn it into JSON with `code`."""

    status = 400

    def __init__(self, code: str, detail: str, *, field: str | None = None, status: int | None = None) -> None:
        super().__init__(detail)
        self.code = code
        self.detail = detail
        self.field = field
        if status is not None:
            self.status = status


class Conflict(DomainError):
    status = 409


class NotFoundError(DomainError):
    status = 404

    def __init__(self, detail: str = "Not found.") -> None:
        super().__init__("not_found", detail)
