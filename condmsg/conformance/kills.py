"""Scenario ``kill-anywhere``: the harness SIGKILLs the receiver under test at random
moments while it delivers a stream of originals, many times (``--kills``), then lets it
finish and requires every original in the app exactly once with exactly one ack.

A receiver picks the moments of the crash scenarios itself; here it cannot. Killed
between its app's commit and a second transaction holding the ack, it leaves an app row
without its ack (the redelivery is a duplicate and earns none); killed between an ack
and the row it stands for, the reverse. Each kill comes once the receiver has handed
over at least one message since it started, after a random pause of a few
milliseconds: between deliveries or inside one, wherever that falls.
"""

from __future__ import annotations

import random
import time
from collections import Counter
from contextlib import suppress

from condmsg.conformance import acks
from condmsg.conformance.expect import DELIVERY_S, direct_original
from condmsg.conformance.world import NotMet, Stopped, TimedOut, World

#: Originals kept waiting in the queue, so that every kill meets the receiver at work.
STOCK = 40
#: The longest random pause (seconds) between the first delivery after a start and the kill.
JITTER_S = 0.03
#: Seconds a restarted receiver has to hand over its first message.
START_S = 30.0


def kill_anywhere(w: World) -> str:
    cms: list[str] = []
    restarts: list[float] = []  # seconds from each start to its first delivery
    rng = random.Random()
    w.kill_receiver()  # the one the run started: from here on the harness picks the moments
    base = w.count_received("original")
    for _ in range(w.config.kills):
        before = w.count_received("original")
        _stock(w, cms, before - base)
        w.receiver.start()

        def working(before: int = before) -> bool:
            code = w.receiver.exited()
            if code is not None:
                raise NotMet(f"the receiver process ended with status {code} before it was killed")
            return w.count_received("original") > before

        started = time.monotonic()
        w.wait_for(working, w.scaled(START_S), "the restarted receiver to deliver")
        restarts.append(time.monotonic() - started)
        stopping = w.abort.wait(rng.uniform(0.0, JITTER_S))
        w.kill_receiver()
        if stopping:
            raise Stopped()
    w.start_receiver()
    mean = sum(restarts) / max(1, len(restarts))
    return f"{_judge(w, cms)}; {mean:.2f}s from a start to the first delivery"


def _stock(w: World, cms: list[str], delivered: int) -> None:
    """Keep :data:`STOCK` of the scenario's originals queued (``delivered`` of ``cms``
    are in the app)."""
    for _ in range(max(0, STOCK - (len(cms) - delivered))):
        cm_id, messages = direct_original(w, b"killed at random")
        for message in messages:
            w.publish(message)
        cms.append(cm_id)


def _judge(w: World, cms: list[str]) -> str:
    wanted = set(cms)

    def rows() -> Counter[str]:
        return Counter(r.cm_id for r in w.received(kind="original") if r.cm_id in wanted)

    with suppress(TimedOut):  # what is missing is judged below, with the acks
        w.wait_for(lambda: len(rows()) == len(wanted), w.scaled(DELIVERY_S), "every original")
    acks.flush(w)
    delivered, acked = rows(), acks.ack_ids(w, cms)
    problems = {
        "app rows without their COMMIT ack": sum(delivered[c] and not acked[c] for c in cms),
        "acks without their app row": sum(bool(acked[c]) and not delivered[c] for c in cms),
        "originals delivered more than once": sum(delivered[c] > 1 for c in cms),
        "originals acked more than once": sum(len(acked[c]) > 1 for c in cms),
        "originals never delivered nor acked": sum(not delivered[c] and not acked[c] for c in cms),
    }
    found = [f"{n} {what}" for what, n in problems.items() if n]
    if found:
        raise NotMet(f"after {w.config.kills} kills, of {len(cms)} originals: {'; '.join(found)}")
    return f"{w.config.kills} kills, {len(cms)} originals: each delivered and acked once"
