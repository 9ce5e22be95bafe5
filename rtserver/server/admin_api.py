"""``/v1/admin/voices``: add and remove voices at run time (LoRA adapters).

- ``POST /v1/admin/voices`` with ``Authorization: Bearer <API key>`` and a
  JSON body ``{"name": "alice", "adapter": "<folder>", "family": "orpheus",
  "speaker": "alice"}`` (``family``: optional when one family makes voices;
  ``speaker``: the name the prompt speaks as, default ``name``; ``name`` may
  carry the family prefix). The family checks the adapter (its folder, PEFT
  layout, and the engine's own checks: rank, modules, shapes) before the voice
  is served. Answer 201 with the voice as ``GET /v1/voices`` lists it; a voice
  that cannot be made is 400 ``{"code": "unknown_voice", "message": <reason>}``.
- ``DELETE /v1/admin/voices?name=orpheus:alice``: new contexts on it are
  ``unknown_voice`` at once; contexts speaking with it go on, and its
  adapter is unloaded once no request has run on it for a grace period.
  200 ``{"removed": name}``; 404 ``unknown_voice`` for a voice not made at
  run time (configured voices stay).

API keys only (a browser token cannot), and only when keys are configured:
without them the endpoint answers 404, so an open server cannot be made to
read folders. ``[orpheus] adapter_root`` confines the folders further.
"""

from __future__ import annotations

import logging
from http import HTTPStatus

from fastapi import APIRouter, Request
from fastapi.responses import Response

from rtserver.cache import PhraseCache
from rtserver.errors import ErrorCode, UnknownVoice
from rtserver.server.asgi import RawResponse, Receive, Send, request_of, send_response
from rtserver.server.http import HttpRequest, HttpResponse, json_response
from rtserver.server.key_api import Refused, api_key, bad_request, json_object
from rtserver.server.state import AppState, voices_json

log = logging.getLogger("rtserver.admin")

ADMIN_VOICES_PATH = "/v1/admin/voices"
MAX_BODY_BYTES = 4096



class AdminApi:
    def __init__(self, app: AppState, cache: PhraseCache | None = None) -> None:
        self.app = app
        self.cache = cache  # the HTTP speech API's: a removed voice's phrases go
        self.configured = set(app.voices)  # voices DELETE leaves alone

    def router(self) -> APIRouter:
        router = APIRouter(tags=["admin"])
        router.add_api_route(
            ADMIN_VOICES_PATH, self._add_route, methods=["POST"], response_class=Response,
            summary="Add a voice at run time (a LoRA adapter; Bearer API key)",
            description="Body: `{\"name\", \"adapter\", \"family\"?, \"speaker\"?}`. "
            "Answer 201 `{\"voice\": ...}`; errors `{\"code\", \"message\"}`. 404 when "
            "the server has no API keys.")
        router.add_api_route(
            ADMIN_VOICES_PATH, self._remove_route, methods=["DELETE"], response_class=Response,
            summary="Remove a voice added at run time (`?name=`; Bearer API key)")
        return router

    async def _add_route(self, request: Request) -> Response:
        http = request_of(request.scope)
        return RawResponse(lambda receive, send: self.add(http, receive, send))

    async def _remove_route(self, request: Request) -> Response:
        http = request_of(request.scope)
        return RawResponse(lambda receive, send: self.remove(http, receive, send))

    def _key(self, request: HttpRequest) -> None:
        api_key(self.app, request, off="no API keys are configured: the admin endpoints are off",
                needed="an API key is needed")

    async def add(self, request: HttpRequest, receive: Receive, send: Send) -> None:
        try:
            answer = await self._add(request, receive)
        except Refused as refused:
            answer = refused.response()
        await send_response(send, answer)

    async def remove(self, request: HttpRequest, receive: Receive, send: Send) -> None:
        try:
            answer = await self._remove(request)
        except Refused as refused:
            answer = refused.response()
        await send_response(send, answer)

    async def _add(self, request: HttpRequest, receive: Receive) -> HttpResponse:
        self._key(request)
        body = await json_object(receive, MAX_BODY_BYTES)
        fields = ("name", "adapter", "family", "speaker")
        if not all(isinstance(body.get(f, ""), str) for f in fields):
            raise bad_request(f"the body is a JSON object of strings: {', '.join(fields)}")
        name, adapter = body.get("name", ""), body.get("adapter", "")
        if not name or not adapter:
            raise bad_request("name and adapter are required")
        prefix, sep, short = name.partition(":")
        family = body.get("family", "") or (prefix if sep else "")
        makers = self.app.makers
        if not family and len(makers) == 1:
            family = next(iter(makers))
        maker = makers.get(family)
        if maker is None or (sep and prefix != family):
            have = ", ".join(makers) or "none (LoRA voices are off, or served by a GPU worker)"
            raise Refused(HTTPStatus.BAD_REQUEST, ErrorCode.UNKNOWN_VOICE.value,
                          f"family {family or '(none given)'!r} does not make voices here; "
                          f"families that do: {have}")
        short = short if sep else name
        if f"{family}:{short}" in self.app.voices:
            raise Refused(HTTPStatus.CONFLICT, ErrorCode.UNKNOWN_VOICE.value,
                          f"voice {family}:{short} exists; remove it first")
        try:
            voice = await maker.add(short, adapter, body.get("speaker") or None)
        except UnknownVoice as exc:
            raise Refused(HTTPStatus.BAD_REQUEST, exc.code.value, exc.message) from None
        full = voice.info.name
        if full not in self.app.voices:  # (a GPU worker's news may have brought it already)
            self.app.add_voice(voice)
        log.info("voice %s added at run time", full)
        (entry,) = voices_json({full: voice}, self.app.default_voice)
        return json_response(HTTPStatus.CREATED, {"voice": entry})

    async def _remove(self, request: HttpRequest) -> HttpResponse:
        self._key(request)
        name = request.query_param("name")
        name = self.app.voice_aliases.get(name, name)
        family, _, short = name.partition(":")
        maker = self.app.makers.get(family)
        if name in self.configured or name not in self.app.voices or maker is None:
            raise Refused(HTTPStatus.NOT_FOUND, ErrorCode.UNKNOWN_VOICE.value,
                          f"no voice {name[:80]!r} was added at run time")
        try:
            await maker.remove(short)
        except UnknownVoice as exc:
            raise Refused(HTTPStatus.NOT_FOUND, exc.code.value, exc.message) from None
        self.app.remove_voice(name)
        if self.cache is not None:
            self.cache.drop_voice(name)
        log.info("voice %s removed at run time", name)
        return json_response(HTTPStatus.OK, {"removed": name})


__all__ = ["ADMIN_VOICES_PATH", "AdminApi"]
