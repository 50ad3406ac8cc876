"""drf-spectacular post-processing: document the answers every operation can give.

DRF answers 401/403 before a view runs, 404 for an unknown id or page, and 400
for malformed input; ``retention.apierrors`` answers 400 for a query parameter
given twice or empty, 414 for an overlong URI and 404 for a path no route
matches, all as JSON. The per-view annotations describe the success cases and
their own errors (409, 503); this hook adds the shared ones, gives every error
answer the one body schema (``Error``: ``retention.apierrors.ERROR_SCHEMA``)
and states a path ``{id}`` as what the router takes (an integer from 1 to
2^63-1), so a client built from the schema knows them all.
"""

from __future__ import annotations

from typing import Any

from retention.apierrors import ERROR_SCHEMA
from retention.apiutils import ID_SCHEMA

ERROR_REF = {"$ref": "#/components/schemas/Error"}
BAD_REQUEST = (
    "invalid input; the body names the field or query parameter: a value of the wrong JSON type, out of range or"
    " not allowed, a reason that breaks the reason rule, a query parameter given twice or empty, a control character"
)
PATH_ID = (
    "An id: an integer from 1 to 2^63-1. An id of no object the caller may see answers 404, as does a path whose id"
    " is not 1 to 19 digits (it matches no route)."
)


def _error(description: str) -> dict[str, Any]:
    return {"description": description, "content": {"application/json": {"schema": ERROR_REF}}}


def _tighten(parameter: dict[str, Any]) -> None:
    """A path ``{id}``: an integer in the router's range; ``page``: from 1."""
    if parameter.get("in") == "path" and parameter.get("name") == "id":
        parameter["schema"] = dict(ID_SCHEMA)
        parameter["description"] = PATH_ID
    elif parameter.get("in") == "query" and parameter.get("name") == "page":
        parameter["schema"] = {**ID_SCHEMA, **parameter.get("schema", {}), "minimum": 1}
        parameter["description"] = "A page number, from 1; a page past the last answers 404."


def add_common_responses(result: dict[str, Any], generator: Any, request: Any, public: bool) -> dict[str, Any]:
    result.setdefault("components", {}).setdefault("schemas", {})["Error"] = ERROR_SCHEMA
    for path, operations in result.get("paths", {}).items():
        for _method, operation in operations.items():
            params = operation.get("parameters", [])
            for parameter in params:
                _tighten(parameter)
            responses = operation.setdefault("responses", {})
            # Anonymous operations (no authentication at all, ``security: [{}]``) never answer 401 or 403.
            if operation.get("security") != [{}]:
                responses.setdefault("401", _error("no or invalid credentials"))
                responses.setdefault("403", _error("the role lacks the permission"))
            if "{" in path or any(p.get("name") == "page" for p in params):
                responses.setdefault("404", _error("no such object, or no such page"))
            responses.setdefault("400", _error(BAD_REQUEST))
            responses.setdefault("414", _error("the path and query string are longer than the API reads"))
            for code, response in responses.items():
                if int(code) >= 400:
                    # An annotation's own description, with the one error body.
                    response["content"] = {"application/json": {"schema": ERROR_REF}}
    return result
