"""The API's one request parser: JSON, checked at the edge before any serializer sees it.

- A NUL character anywhere (a key or a value, at any depth) is refused: PostgreSQL cannot store it
  in text, and a slug-related field sent it straight into a query (a 500). Checking the parsed
  document here covers every field, including ones added later.
- Nesting is bounded: 100k-deep brackets made `json.loads` raise RecursionError (a 500), and a
  document just under the interpreter's limit would make every recursive walker after it fail.
"""

from __future__ import annotations

from typing import Any

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


class JSONParser(parsers.JSONParser):
    def parse(self, stream, media_type=None, parser_context=None):
        try:
            data = super().parse(stream, media_type, parser_context)
        except RecursionError:
            raise ParseError(f"JSON parse error - nested deeper than {MAX_DEPTH} levels.") from None
        check_document(data)
        return data
