"""``/api/v1/tokens/``: one's own API tokens, listed and revoked.

Any logged-in user (a session or a token) lists their own tokens — their id
(the ``token_key`` knox keeps: the secret's first characters), when each was
issued and when it expires, never the secret (the table holds only its
digest) — and revokes one by its id. Another user's token id answers 404,
exactly like an id that does not exist. Tokens are issued by
``manage.py cleanup_api_token issue`` (``cleanup_ops.api_tokens``).
"""

from __future__ import annotations

from typing import Any

from django.db.models import QuerySet
from drf_spectacular.utils import OpenApiResponse, extend_schema, extend_schema_view
from knox.models import AuthToken
from rest_framework import mixins, serializers, status, viewsets
from rest_framework.exceptions import NotFound
from rest_framework.request import Request
from rest_framework.response import Response

from cleanup_ops.api_tokens import TokenNotFound, api_token_revoke
from cleanup_ops.selectors import api_tokens_of
from retention.actors import request_actor


class ApiTokenSerializer(serializers.Serializer):
    """A token as its owner sees it: never the secret."""

    id = serializers.CharField(source="token_key", read_only=True, help_text="the token's first characters")
    created = serializers.DateTimeField(read_only=True)
    expiry = serializers.DateTimeField(read_only=True, allow_null=True)
    current = serializers.SerializerMethodField(help_text="whether this request was authenticated with it")

    def get_current(self, token: AuthToken) -> bool:
        auth = self.context["request"].auth
        return isinstance(auth, AuthToken) and auth.pk == token.pk


@extend_schema_view(
    list=extend_schema(summary="Your API tokens (ids, never secrets)"),
    destroy=extend_schema(
        summary="Revoke one of your API tokens",
        responses={204: OpenApiResponse(description="revoked"), 404: OpenApiResponse(description="no such token")},
    ),
)
class ApiTokenViewSet(mixins.ListModelMixin, mixins.DestroyModelMixin, viewsets.GenericViewSet):
    serializer_class = ApiTokenSerializer
    queryset = AuthToken.objects.none()  # the model, for the schema; get_queryset is the user's
    # The id is knox's token_key (not the digest, the table's primary key):
    # hex digits, 15 (the first 15 of a token carried over from DRF's).
    lookup_field = "token_key"
    lookup_url_kwarg = "token_id"
    lookup_value_regex = "[0-9A-Za-z_-]{1,25}"

    def get_queryset(self) -> QuerySet[Any]:
        return api_tokens_of(user=self.request.user)

    def destroy(self, request: Request, *args: Any, **kwargs: Any) -> Response:
        try:
            actor = request_actor(request)
            api_token_revoke(user=actor, token_id=kwargs["token_id"], revoked_by=actor)
        except TokenNotFound:
            raise NotFound("No such token.") from None
        return Response(status=status.HTTP_204_NO_CONTENT)
