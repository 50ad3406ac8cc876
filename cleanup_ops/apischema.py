"""drf-spectacular post-processing: document the answers every operation can give.

DRF answers 401/403 before a view runs, 404 for an unknown id or page, and 400
for malformed filters; the per-view annotations describe the success cases and
their own errors. This hook adds the shared ones so a client built from the
schema knows them all.
"""

from __future__ import annotations

from typing import Any

ERROR = {"type": "object", "additionalProperties": True}


def _add(responses: dict[str, Any], code: str, description: str) -> None:
    responses.setdefault(code, {"description": description, "content": {"application/json": {"schema": ERROR}}})


def add_common_responses(result: dict[str, Any], generator: Any, request: Any, public: bool) -> dict[str, Any]:
    for path, operations in result.get("paths", {}).items():
        for method, operation in operations.items():
            responses = operation.setdefault("responses", {})
            _add(responses, "401", "no or invalid credentials")
            _add(responses, "403", "the role lacks the permission")
            params = operation.get("parameters", [])
            if "{" in path or any(p.get("name") == "page" for p in params):
                _add(responses, "404", "no such object, or no such page")
            if method in {"post", "put", "patch"} or any(p.get("in") == "query" for p in params):
                _add(responses, "400", "invalid input; the body names the field")
    return result
