"""Secure by default: read-only without a token, bearer tokens for writes, strict headers.

- Reads (GET) are open to whoever can reach the port; the server binds 127.0.0.1 unless told.
- Writes (enqueue a config, stop a study, delete a study) need ``Authorization: Bearer TOKEN``
  matching SWEEPER_API_TOKEN, compared in constant time. Without a configured token the server
  is read-only: writes answer 403 and say how to enable them.
- Every response carries a Content-Security-Policy (our pages run only our own scripts) and
  nosniff / no-referrer headers. CORS is off unless origins are listed explicitly.
"""

from __future__ import annotations

import secrets
from typing import Annotated

from fastapi import Depends, HTTPException, Request
from fastapi.security import HTTPAuthorizationCredentials, HTTPBearer
from starlette.types import ASGIApp, Message, Receive, Scope, Send

# Pages run only our own scripts; data reaches them as JSON, never as inline code. plotly.js
# sets inline styles, hence 'unsafe-inline' for styles only.
CONTENT_SECURITY_POLICY = (
    "default-src 'self'; script-src 'self'; style-src 'self' 'unsafe-inline'; "
    "img-src 'self' data:; connect-src 'self'; object-src 'none'; base-uri 'none'; "
    "form-action 'self'; frame-ancestors 'none'"
)
SECURITY_HEADERS = {
    "content-security-policy": CONTENT_SECURITY_POLICY,
    "x-content-type-options": "nosniff",
    "referrer-policy": "no-referrer",
    "x-frame-options": "DENY",
}

_bearer = HTTPBearer(auto_error=False, description="SWEEPER_API_TOKEN, for write endpoints")


def require_token(
    request: Request,
    credentials: Annotated[HTTPAuthorizationCredentials | None, Depends(_bearer)],
) -> None:
    """Let a write through only with the configured bearer token."""
    expected: str | None = request.app.state.api_token
    if expected is None:
        raise HTTPException(
            status_code=403,
            detail="this server is read-only: start it with SWEEPER_API_TOKEN set to enable "
            "writes, and send the token as 'Authorization: Bearer <token>'",
        )
    challenge = {"WWW-Authenticate": "Bearer"}
    if credentials is None or credentials.scheme.lower() != "bearer":
        raise HTTPException(
            status_code=401,
            detail="missing bearer token: send 'Authorization: Bearer <SWEEPER_API_TOKEN>'",
            headers=challenge,
        )
    if not secrets.compare_digest(credentials.credentials.encode(), expected.encode()):
        raise HTTPException(status_code=401, detail="invalid bearer token", headers=challenge)


WriteAccess = Depends(require_token)


class SecurityHeaders:
    """Adds SECURITY_HEADERS to every HTTP response that does not set them itself."""

    def __init__(self, app: ASGIApp) -> None:
        self.app = app

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        if scope["type"] != "http":
            await self.app(scope, receive, send)
            return

        async def send_with_headers(message: Message) -> None:
            if message["type"] == "http.response.start":
                headers = list(message.get("headers", []))
                present = {name.lower() for name, _ in headers}
                for name, value in SECURITY_HEADERS.items():
                    if name.encode() not in present:
                        headers.append((name.encode(), value.encode()))
                message["headers"] = headers
            await send(message)

        await self.app(scope, receive, send_with_headers)


MAX_BODY_BYTES = 1 << 20  # a config is a few hundred bytes; nothing we accept comes near 1 MiB


class BodyLimit:
    """Answers 413 to a request body over ``MAX_BODY_BYTES`` (by its Content-Length, or as it
    streams in without one) before any route reads it."""

    def __init__(self, app: ASGIApp, max_bytes: int = MAX_BODY_BYTES) -> None:
        self.app, self.max_bytes = app, max_bytes

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        if scope["type"] != "http":
            await self.app(scope, receive, send)
            return
        declared = dict(scope.get("headers", [])).get(b"content-length")
        if declared is not None and (not declared.isdigit() or int(declared) > self.max_bytes):
            await self._too_large(send)
            return
        received = 0

        async def counted() -> Message:
            nonlocal received
            message = await receive()
            if message["type"] == "http.request":
                received += len(message.get("body", b""))
                if received > self.max_bytes:
                    raise _TooLarge()
            return message

        try:
            await self.app(scope, counted, send)
        except _TooLarge:
            await self._too_large(send)

    async def _too_large(self, send: Send) -> None:
        await send_json(
            send,
            413,
            b'{"detail":"the request body is over %d bytes; a config is a few hundred"}'
            % self.max_bytes,
        )


class _TooLarge(Exception):
    pass


async def send_json(send: Send, status: int, body: bytes) -> None:
    """A whole JSON response, from an ASGI middleware that answers before the app."""
    await send(
        {
            "type": "http.response.start",
            "status": status,
            "headers": [
                (b"content-type", b"application/json"),
                (b"content-length", str(len(body)).encode()),
            ],
        }
    )
    await send({"type": "http.response.body", "body": body})


class NoNulBytes:
    """Answers 422 to a URL with a NUL byte anywhere in its path or query: Postgres text
    cannot hold one, and no name, filter or value of ours contains one."""

    def __init__(self, app: ASGIApp) -> None:
        self.app = app

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        if scope["type"] == "http":
            raw = scope.get("raw_path") or scope.get("path", "").encode()
            query = scope.get("query_string", b"")
            if b"\x00" in raw or b"%00" in raw.lower() or b"%00" in query.lower():
                body = b'{"detail":"the URL contains a NUL byte (%00); no name or filter has one"}'
                await send_json(send, 422, body)
                return
        await self.app(scope, receive, send)
