"""The example Starlette app (examples/async_app) end to end: an order and its conditional
message in one AsyncSession transaction, the app's own relay, a real evaluator and receiver,
outcomes awaited through the app; every request served without stalling the event loop."""

from __future__ import annotations

import json
from typing import Any

import pytest
import sqlalchemy as sa

from condmsg.sending.async_sender import AsyncSender
from examples.async_app.app import create_app, orders
from tests.async_helpers import asgi_request, run_async
from tests.e2e.conftest import Procs, records
from tests.waiting import wait_for

pytestmark = [pytest.mark.rabbitmq, pytest.mark.postgres]


def test_orders_are_sent_in_their_transaction_and_their_outcomes_awaited(
    procs: Procs, test_secret: bytes
) -> None:
    read_q, unread_q = f"{procs.unique_name}.q", f"{procs.unique_name}.q1"
    procs.evaluator("--no-relay")  # the copies leave through the app's own relay
    out = procs.receiver(read_q, "alice", "commit")
    procs.wait_ready([out], consumers=1)
    sender = AsyncSender(
        amqp_url=procs.amqp_url,
        db_url=procs.pg_url,
        name=procs.sender,
        secret=test_secret,
        create_schema=True,
    )
    app = create_app(sender)

    async def call(method: str, path: str, doc: Any = None) -> tuple[int, Any]:
        body = b"" if doc is None else doc if isinstance(doc, bytes) else json.dumps(doc).encode()
        status, answer = await asgi_request(app, method, path, body)
        return status, json.loads(answer)

    async def main() -> dict[str, Any]:
        async with app.router.lifespan_context(app):
            seen: dict[str, Any] = {}
            seen["bad"] = [
                await call("POST", "/orders", b"{"),
                await call("POST", "/orders", {"item": "tea", "pickup_s": -1}),
                await call("POST", "/orders", {"item": "tea", "queue": 5}),
            ]
            status, tea = await call("POST", "/orders", {"item": "tea", "queue": read_q})
            assert status == 201, tea
            status, cup = await call(
                "POST", "/orders", {"item": "cup", "queue": unread_q, "pickup_s": 0.5}
            )
            assert status == 201, cup
            seen["tea"] = await call("GET", f"/orders/{tea['cm_id']}/outcome?wait=30")
            seen["cup"] = await call("GET", f"/orders/{cup['cm_id']}/outcome?wait=30")
            seen["unknown"] = await call("GET", "/orders/nope/outcome")
            seen["bad_wait"] = await call("GET", f"/orders/{tea['cm_id']}/outcome?wait=x")
            async with sender.engine.connect() as conn:
                rows = await conn.execute(sa.select(orders.c.item, orders.c.cm_id))
                seen["orders"] = sorted(tuple(r) for r in rows)
            seen["ids"] = (tea, cup)
            return seen

    seen = run_async(main())
    assert [status for status, _ in seen["bad"]] == [400, 400, 400]
    assert all(set(error) == {"error"} for _, error in seen["bad"])
    tea, cup = seen["ids"]
    assert seen["tea"] == (200, seen["tea"][1]) and seen["tea"][1]["verdict"] == "satisfied"
    assert seen["cup"][0] == 200 and seen["cup"][1]["verdict"] == "violated"
    assert seen["unknown"][0] == 404 and seen["bad_wait"][0] == 400
    # Each order row committed with its CM, and only the two valid orders exist.
    assert seen["orders"] == sorted([("tea", tea["cm_id"]), ("cup", cup["cm_id"])])
    got = wait_for(lambda: [r for r in records(out) if "payload" in r], 10)
    assert [(r["cm_id"], json.loads(r["payload"])) for r in got] == [
        (tea["cm_id"], {"item": "tea"})
    ]
