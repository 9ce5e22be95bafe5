"""``POST /v1/tokens``: a backend that holds an API key mints a short-lived
signed token for a browser (rtserver.server.tokens), which opens the stream
with ``?token=...``; the key never reaches the page.

Request: ``Authorization: Bearer <API key>`` (a token cannot mint tokens) and
an optional JSON body ``{"ttl_s": 300, "scope": ["stream"]}``. Answer:
``{"token", "expires_at" (Unix seconds), "expires_in_s", "scope"}``. Without
configured API keys there is nothing to protect and the endpoint answers 404.
"""

from __future__ import annotations

import time
from http import HTTPStatus

from fastapi import APIRouter, Request
from fastapi.responses import Response

from rtserver.server.asgi import RawResponse, Receive, Send, request_of, send_response
from rtserver.server.http import HttpRequest, HttpResponse, json_response
from rtserver.server.key_api import Refused, api_key, bad_request, json_object
from rtserver.server.state import AppState
from rtserver.server.tokens import SCOPE_STREAM, SCOPES, key_id, mint

TOKENS_PATH = "/v1/tokens"
MAX_BODY_BYTES = 4096


class TokenApi:
    def __init__(self, app: AppState) -> None:
        self.app = app

    def router(self) -> APIRouter:
        router = APIRouter(tags=["browser tokens"])
        router.add_api_route(
            TOKENS_PATH, self._route, methods=["POST"], response_class=Response,
            summary="Mint a short-lived token for a browser (Bearer API key)",
            description="Body (optional): `{\"ttl_s\": 300, \"scope\": [\"stream\"]}`. "
            "Answer: `{\"token\", \"expires_at\", \"expires_in_s\", \"scope\"}`; "
            "errors `{\"code\", \"message\"}`. 404 when the server has no API keys.")
        return router

    async def _route(self, request: Request) -> Response:
        http = request_of(request.scope)
        return RawResponse(lambda receive, send: self.mint(http, receive, send))

    async def mint(self, request: HttpRequest, receive: Receive, send: Send) -> None:
        try:
            answer = await self._answer(request, receive)
        except Refused as refused:
            answer = refused.response()
        await send_response(send, answer)

    async def _answer(self, request: HttpRequest, receive: Receive) -> HttpResponse:
        adm = self.app.config.admission
        key = api_key(self.app, request, off="no API keys are configured: no tokens needed",
                      needed="an API key is needed to mint tokens")
        body = await json_object(receive, MAX_BODY_BYTES, empty=True)
        ttl = body.get("ttl_s", adm.token_ttl_s)
        if isinstance(ttl, bool) or not isinstance(ttl, int | float) \
                or not 1 <= ttl <= adm.token_max_ttl_s:
            raise bad_request(f"ttl_s must be a number from 1 to {adm.token_max_ttl_s:g}")
        scope = body.get("scope", [SCOPE_STREAM])
        if not (isinstance(scope, list) and scope
                and all(isinstance(s, str) and s in SCOPES for s in scope)):
            raise bad_request(f"scope must be a list of {', '.join(SCOPES)}")
        now = time.time()
        token, claims = mint(self.app.gate.secret, key_id(key), scope, float(ttl), now)
        return json_response(HTTPStatus.OK, {
            "token": token, "expires_at": claims.expires_at,
            "expires_in_s": ttl, "scope": list(claims.scopes)})


__all__ = ["TOKENS_PATH", "TokenApi"]
