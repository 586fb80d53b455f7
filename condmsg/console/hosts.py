"""Which ``Host`` names the console answers.

A page on another site cannot read the console's answers (the browser's same-origin
policy), unless its own name comes to point at the console's address: DNS rebinding. The
browser then sends that foreign name in ``Host``, so the console answers only the names it
is known by (its bind address, ``localhost`` and the loopback addresses when it listens on
loopback, and those given with ``--allowed-host``) and refuses every other with 400.
"""

from __future__ import annotations

import ipaddress
from collections.abc import Collection

from starlette.responses import PlainTextResponse
from starlette.types import ASGIApp, Receive, Scope, Send

#: What a loopback bind is reached by.
LOOPBACK_NAMES = frozenset({"localhost", "127.0.0.1", "::1"})
#: Bind addresses that listen on every interface: no client names them in ``Host``.
WILDCARD_BINDS = frozenset({"", "0.0.0.0", "::"})


def is_loopback(host: str) -> bool:
    """Whether the bind address ``host`` is reachable from this machine only."""
    if host.lower() == "localhost":
        return True
    try:
        return ipaddress.ip_address(host.strip("[]")).is_loopback
    except ValueError:
        return False


def allowed_names(bind: str, extra: Collection[str] = ()) -> frozenset[str]:
    """The ``Host`` names a console bound to ``bind`` answers, with ``extra`` ones."""
    names = {normalize(n) for n in extra if n.strip()}
    if bind not in WILDCARD_BINDS:
        names.add(normalize(bind))
    if is_loopback(bind):
        names |= LOOPBACK_NAMES
    return frozenset(names)


def normalize(name: str) -> str:
    """``name`` lower case, without brackets or a trailing dot."""
    return name.strip().strip("[]").rstrip(".").lower()


def host_name(header: str) -> str:
    """The name of a ``Host`` header, without its port (``[::1]:8465`` gives ``::1``)."""
    header = header.strip()
    if header.startswith("["):
        return normalize(header.partition("]")[0])
    return normalize(header.partition(":")[0])


class AllowedHosts:
    """ASGI middleware: HTTP requests whose ``Host`` is not one of ``names`` get 400."""

    def __init__(self, app: ASGIApp, names: Collection[str]) -> None:
        self.app = app
        self.names = frozenset(names)

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        if scope["type"] != "http":
            await self.app(scope, receive, send)
            return
        headers = dict(scope.get("headers") or [])
        header = headers.get(b"host", b"").decode("latin-1")
        if host_name(header) in self.names:
            await self.app(scope, receive, send)
            return
        shown = header.encode("ascii", "backslashreplace").decode()[:100] or "(none)"
        response = PlainTextResponse(
            f"Host {shown} is not a name of this console; start it with --allowed-host "
            "NAME for each name clients use\n",
            400,
            headers={"X-Content-Type-Options": "nosniff"},
        )
        await response(scope, receive, send)
