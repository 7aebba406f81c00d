"""The API's one request parser: JSON, checked at the edge before any serializer sees it.

- A NUL character anywhere (a key or a value, at any depth) is refused: PostgreSQL cannot store it
  in text, and a slug-related field sent it straight into a query (a 500). Checking the parsed
  document here covers every field, including ones added later.
- Nesting is bounded: 100k-deep brackets made `json.loads` raise RecursionError (a 500), and a
  document just under the interpreter's limit would make every recursive walker after it fail.
- Size is bounded: a body over the view's `max_body_bytes` (API_MAX_BODY_BYTES, 1 MiB by default; config
  documents allow more) answers 413 `request_too_large` before it is parsed. The stream is read to one
  byte past the limit, so a body without Content-Length (chunked) is bounded too.
"""

from __future__ import annotations

import io
from typing import Any

from django.conf import settings
from rest_framework import parsers
from rest_framework.exceptions import ParseError

from apps.core.api.errors import ApiError

MAX_DEPTH = 32  # our deepest body (a route's targets in a list in an object) needs 4


NUL_CODE = "null_characters_not_allowed"  # DRF's own code for the same refusal by a CharField


class NulCharacter(ApiError):
    def __init__(self, field: str | None) -> None:
        message = "Text must not contain NUL (\\u0000) characters."
        super().__init__(NUL_CODE, message, fields={field: [message]} if field else {})


def check_document(data: Any) -> None:
    """Raise ParseError / NulCharacter for a too-deep document or a NUL anywhere in it (iteratively).

    The error names the top-level field that carries the NUL, like a field validator would.
    """
    stack: list[tuple[Any, int, str | None]] = [(data, 1, None)]
    while stack:
        value, depth, field = stack.pop()
        if isinstance(value, str):
            if "\x00" in value:
                raise NulCharacter(field)
        elif isinstance(value, dict | list):
            if depth > MAX_DEPTH:
                raise ParseError(f"JSON nested deeper than {MAX_DEPTH} levels.")
            items = value.items() if isinstance(value, dict) else enumerate(value)
            for key, item in items:
                name = field if field is not None or not isinstance(key, str) else key
                if isinstance(key, str) and "\x00" in key:
                    raise NulCharacter(None)
                stack.append((item, depth + 1, name))


class RequestTooLarge(ApiError):
    def __init__(self, limit: int) -> None:
        super().__init__("request_too_large", f"The request body is larger than {limit:,} bytes; send less at "
                         "once (several requests, or a bulk endpoint).", status_code=413)


def max_body_bytes(parser_context: dict | None) -> int:
    view = (parser_context or {}).get("view")
    return int(getattr(view, "max_body_bytes", None) or getattr(settings, "API_MAX_BODY_BYTES", 1024 * 1024))


def bounded(stream, limit: int, parser_context: dict | None):
    """The body as a stream of at most `limit` bytes, or RequestTooLarge."""
    request = (parser_context or {}).get("request")
    declared = getattr(request, "META", {}).get("CONTENT_LENGTH") if request is not None else None
    if declared and str(declared).isdigit() and int(declared) > limit:
        raise RequestTooLarge(limit)
    body = stream.read(limit + 1) if stream is not None else b""
    if len(body) > limit:
        raise RequestTooLarge(limit)
    return io.BytesIO(body)


class JSONParser(parsers.JSONParser):
    def parse(self, stream, media_type=None, parser_context=None):
        stream = bounded(stream, max_body_bytes(parser_context), parser_context)
        try:
            data = super().parse(stream, media_type, parser_context)
        except RecursionError:
            raise ParseError(f"JSON parse error - nested deeper than {MAX_DEPTH} levels.") from None
        check_document(data)
        return data
