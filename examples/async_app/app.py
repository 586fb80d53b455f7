"""An asyncio web app that sends a conditional message per order, in the order's own
database transaction, and tells a CM's outcome (docs/async.md, "An example app").

    CONDMSG_DB_URL=postgresql+psycopg://... CONDMSG_AMQP_URL=amqp://... \\
    CONDMSG_SECRET=... uvicorn --factory examples.async_app.app:create_app

- ``POST /orders`` with ``{"item": "...", "queue": "...", "pickup_s": 30}``: the order row
  and the CM (the warehouse queue must pick the notice up within ``pickup_s`` seconds) are
  written in one ``AsyncSession`` transaction, so there is never an order without its
  notice, nor a notice without its order; answers 201 with both ids.
- ``GET /orders/{cm_id}/outcome?wait=5``: the CM's outcome, waiting up to ``wait`` seconds
  for the evaluator's verdict (200), or 202 while it is pending, 404 for an unknown id.

The app runs the sender's outbox relay for its lifetime (``sender.relaying()``), so the
notices leave as soon as their transactions commit; a deployment may run ``condmsg relay``
instead. An evaluator (``condmsg evaluator``) decides the outcomes.
"""

from __future__ import annotations

import json
import math
import os
from collections.abc import AsyncIterator
from contextlib import AsyncExitStack, asynccontextmanager
from datetime import timedelta
from typing import Any

import sqlalchemy as sa
from sqlalchemy.ext.asyncio import AsyncSession
from starlette.applications import Starlette
from starlette.requests import Request
from starlette.responses import JSONResponse
from starlette.routing import Route

from condmsg import AsyncSender, ConditionError, ConfigError, Destination

#: The app's own table, in the sender's database: an order and the CM that announced it.
metadata = sa.MetaData()
orders = sa.Table(
    "example_orders",
    metadata,
    sa.Column("order_id", sa.Integer, primary_key=True, autoincrement=True),
    sa.Column("item", sa.String(200), nullable=False),
    sa.Column("cm_id", sa.String(36), nullable=False, unique=True),
)

#: Where order notices go unless a request names a queue, and the sender's name.
ENV_QUEUE = "EXAMPLE_QUEUE"
ENV_SENDER = "EXAMPLE_SENDER"
#: The longest a request may wait for an outcome (seconds).
MAX_WAIT_S = 30.0


class BadRequest(Exception):
    """A request this app refuses (answered 400 with the message)."""


def _order(body: bytes) -> tuple[str, str | None, float]:
    """(item, queue or None, pickup seconds) of a ``POST /orders`` body."""
    try:
        doc = json.loads(body)
    except ValueError:
        raise BadRequest("the body must be a JSON object") from None
    if not isinstance(doc, dict):
        raise BadRequest("the body must be a JSON object")
    item, queue, pickup = doc.get("item"), doc.get("queue"), doc.get("pickup_s", 30)
    if not isinstance(item, str) or not 0 < len(item) <= 200:
        raise BadRequest("item must be a string of 1 to 200 characters")
    if queue is not None and not isinstance(queue, str):
        raise BadRequest("queue must be a string")
    if isinstance(pickup, bool) or not isinstance(pickup, int | float):
        raise BadRequest("pickup_s must be a number of seconds")
    if not (math.isfinite(pickup) and 0.1 <= pickup <= 86400):
        raise BadRequest("pickup_s must be between 0.1 and 86400 seconds")
    return item, queue, float(pickup)


def create_app(sender: AsyncSender | None = None, *, relay: bool = True) -> Starlette:
    """The app, on ``sender`` (else one from the environment: ``CONDMSG_*`` and
    ``EXAMPLE_SENDER``); ``relay=False`` leaves relaying to ``condmsg relay``."""
    if sender is None:
        sender = AsyncSender.from_env(name=os.environ.get(ENV_SENDER, "orders"))
    the_sender = sender
    default_queue = os.environ.get(ENV_QUEUE, "warehouse")

    async def place_order(request: Request) -> JSONResponse:
        try:
            item, queue, pickup_s = _order(await request.body())
            condition = Destination(
                queue or default_queue, pickup_within=timedelta(seconds=pickup_s)
            )
        except (BadRequest, ConditionError) as exc:  # ConditionError: a queue name refused
            return JSONResponse({"error": str(exc)}, status_code=400)
        async with AsyncSession(the_sender.engine) as session, session.begin():
            # The notice and the order commit together, or neither does.
            cm_id = await the_sender.send({"item": item}, condition, session=session)
            inserted = sa.insert(orders).values(item=item, cm_id=cm_id)
            result = await session.execute(inserted.returning(orders.c.order_id))
            order_id = result.scalar_one()
        return JSONResponse({"order_id": order_id, "cm_id": cm_id}, status_code=201)

    async def outcome(request: Request) -> JSONResponse:
        cm_id = request.path_params["cm_id"]
        try:
            wait = min(float(request.query_params.get("wait", "0")), MAX_WAIT_S)
        except ValueError:
            return JSONResponse({"error": "wait must be a number of seconds"}, status_code=400)
        if not math.isfinite(wait) or wait < 0:
            return JSONResponse({"error": "wait must be 0 or more seconds"}, status_code=400)
        try:
            found = await the_sender.outcome(cm_id, timeout=wait)
        except ConfigError:
            return JSONResponse({"error": f"no order notice {cm_id!r}"}, status_code=404)
        if found is None:
            return JSONResponse({"cm_id": cm_id, "verdict": "pending"}, status_code=202)
        body: dict[str, Any] = {"cm_id": cm_id, "verdict": found.verdict.value}
        body["reasons"] = list(found.reasons)
        return JSONResponse(body)

    @asynccontextmanager
    async def lifespan(app: Starlette) -> AsyncIterator[None]:
        async with AsyncExitStack() as stack:
            await stack.enter_async_context(the_sender)
            async with the_sender.engine.begin() as conn:
                await conn.run_sync(metadata.create_all)
            if relay:
                await stack.enter_async_context(the_sender.relaying())
            yield

    return Starlette(
        routes=[
            Route("/orders", place_order, methods=["POST"]),
            Route("/orders/{cm_id}/outcome", outcome, methods=["GET"]),
        ],
        lifespan=lifespan,
    )
