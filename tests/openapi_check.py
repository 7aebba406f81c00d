"""Validate a live response body against the operation's documented response in /api/v1/schema/."""

from __future__ import annotations

from functools import cache
from typing import Any

import jsonschema


@cache
def _document() -> dict:
    from rest_framework.test import APIClient

    response = APIClient().get("/api/v1/schema/", {"format": "json"})
    assert response.status_code == 200
    return response.json()


def _json_schema(node: Any, components: dict) -> Any:
    """OpenAPI 3.0 → JSON Schema: inline $refs, `nullable: true` as a null alternative."""
    if isinstance(node, list):
        return [_json_schema(item, components) for item in node]
    if not isinstance(node, dict):
        return node
    if "$ref" in node:
        return _json_schema(components[node["$ref"].rsplit("/", 1)[1]], components)
    out = {key: _json_schema(value, components) for key, value in node.items()
           if key not in ("nullable", "readOnly", "writeOnly", "example", "discriminator")}
    if node.get("nullable"):
        return {"anyOf": [out, {"type": "null"}]}
    return out


def assert_matches_schema(method: str, path: str, response) -> None:
    """`path` as the schema names it (/api/v1/fleets/{id}/health/)."""
    doc = _document()
    documented = doc["paths"][path][method]["responses"][str(response.status_code)]
    schema = _json_schema(documented["content"]["application/json"]["schema"], doc["components"]["schemas"])
    jsonschema.validate(response.json(), schema)
