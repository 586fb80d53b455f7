"""``condmsg console``: a web console over a sender store (``pip install 'condmsg[console]'``).

Server-rendered pages (Starlette, Jinja2, uvicorn; no build step, nothing from a CDN) that
show the CMs, their trees and timelines, the spheres, the outbox's parked rows and the
dead letters, and that requeue or purge parked rows behind a token. See docs/console.md.
This package imports the extra's modules, so only :mod:`condmsg.cli.console` imports it,
and only when the command runs.
"""

from condmsg.console.app import ConsoleConfig, Store, create_app

__all__ = ["ConsoleConfig", "Store", "create_app"]
