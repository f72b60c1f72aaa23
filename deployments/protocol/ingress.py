"""What every replica's HTTP server does before Serve sees a request: inference runs to completion.

Serve's direct ingress watches each request for a client disconnect, to cancel it:
a receive task per request and an ``asyncio.wait`` over it and the request. Triton
does not cancel an HTTP inference whose client went away (the response is
dropped), and neither does this server: :func:`middlewares` (named by
``RAY_SERVE_HTTP_PROXY_CALLBACK_IMPORT_PATH``, see ``deployments.launch``) marks
every request with Serve's "disconnect disabled" header, which lets Serve await
the application directly.
"""

from __future__ import annotations

from collections.abc import Awaitable, Callable, MutableMapping
from typing import Any

from starlette.middleware import Middleware

DISCONNECT_DISABLED = (b"x-request-disconnect-disabled", b"?1")

Scope = MutableMapping[str, Any]
ASGIApp = Callable[[Scope, Any, Any], Awaitable[None]]


class RunToCompletion:
    """ASGI middleware: HTTP requests carry Serve's header that turns disconnect watching off."""

    def __init__(self, app: ASGIApp) -> None:
        self.app = app

    async def __call__(self, scope: Scope, receive: Any, send: Any) -> None:
        if scope["type"] == "http":
            headers = scope["headers"]
            if isinstance(headers, list):
                headers.append(DISCONNECT_DISABLED)
            else:
                scope["headers"] = [*headers, DISCONNECT_DISABLED]
        await self.app(scope, receive, send)


def middlewares() -> list[Middleware]:
    """The replica HTTP servers' extra middleware (Serve's HTTP proxy callback)."""
    return [Middleware(RunToCompletion)]
