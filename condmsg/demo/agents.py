"""The demo's participants as seen from the script: receiver processes it drives through
their stdin (``condmsg.demo.rx``), and the sender's outcome queue it listens to (CM and
sphere outcomes)."""

from __future__ import annotations

import json
import subprocess
import sys
import threading
from collections.abc import Callable, Iterable
from datetime import datetime
from pathlib import Path
from typing import Any

from condmsg.core.errors import CondmsgError
from condmsg.core.outcome import Outcome, SphereOutcome
from condmsg.core.timeutil import utcnow
from condmsg.demo.setup import wait_for
from condmsg.demo.story import Story
from condmsg.sending.sender import Sender


class RxProcess:
    """One receiver process: ``label`` (e.g. ``qr3/carol``) reading ``queue`` as
    ``recipient``, with the store and secret of ``env``. Its events are kept and told."""

    def __init__(
        self,
        *,
        label: str,
        queue: str,
        recipient: str,
        invalid_queue: str,
        env: dict[str, str],
        log_dir: Path,
        story: Story,
    ) -> None:
        self.label = label
        self.story = story
        config = {"recipient": recipient, "queue": queue, "invalid": invalid_queue}
        log = (log_dir / f"rx-{label.replace('/', '-')}.log").open("ab")
        self.proc = subprocess.Popen(
            [sys.executable, "-m", "condmsg.demo.rx", json.dumps(config)],
            env=env,
            stdin=subprocess.PIPE,
            stdout=subprocess.PIPE,
            stderr=log,
        )
        self._events: list[dict[str, Any]] = []
        self._seq = 0
        self._lock = threading.Lock()
        self._reader = threading.Thread(target=self._read, name=f"rx-{label}", daemon=True)
        self._reader.start()

    def _read(self) -> None:
        assert self.proc.stdout is not None
        for raw in self.proc.stdout:
            event = json.loads(raw)
            with self._lock:
                previous = self._stats()
                self._events.append(event)
            if event["event"] in ("ready", "mode"):
                continue
            if event["event"] == "stats":
                cancelled = event["cancelled"] - previous.get("cancelled", 0)
                discards = event["discards"] - previous.get("discards", 0)
                if cancelled or discards:
                    self.story.cancelled_out(self.label, cancelled, discards)
            else:
                self.story.receiver_event(self.label, event)

    # -- commands ----------------------------------------------------------------------

    def _send(self, command: dict[str, Any]) -> None:
        assert self.proc.stdin is not None
        self.proc.stdin.write(json.dumps(command).encode() + b"\n")
        self.proc.stdin.flush()

    def request_mode(self, **mode: Any) -> Callable[[], bool]:
        """Ask for a mode change; returns whether it is in force yet (it is taken between
        two reads, after the transaction in hand)."""
        self._seq += 1
        seq = self._seq
        self._send({"op": "mode", "seq": seq, **mode})

        def applied() -> bool:
            with self._lock:
                return any(e["event"] == "mode" and e["seq"] == seq for e in self._events)

        return applied

    def start_reading(
        self, *, transactional: bool = True, hold_s: float = 0.0, announce: bool = False
    ) -> None:
        """Read from now on: in transactions held ``hold_s`` s for an original (saying so
        if ``announce``), or without transactions."""
        applied = self.request_mode(
            active=True, transactional=transactional, hold_s=hold_s, announce=announce
        )
        wait_for(applied, 30, f"{self.label} to start reading")

    def quit(self, timeout: float = 20.0) -> int:
        """Ask it to stop (its relay flushes, its connections close); kill it if it hangs."""
        if self.proc.poll() is None:
            try:
                self._send({"op": "quit"})
                assert self.proc.stdin is not None
                self.proc.stdin.close()
            except (BrokenPipeError, OSError):
                pass
        try:
            code = self.proc.wait(timeout)
        except subprocess.TimeoutExpired:
            self.proc.kill()
            code = self.proc.wait()
        self._reader.join(5)
        return code

    # -- what it reported ----------------------------------------------------------------

    @property
    def ready(self) -> bool:
        with self._lock:
            return any(e["event"] == "ready" for e in self._events)

    def got(self, cm_id: str) -> list[str]:
        """The kinds of message its app got for ``cm_id``, in order."""
        with self._lock:
            return [e["kind"] for e in self._events if e["event"] == "got" and e["cm_id"] == cm_id]

    def payloads(self, cm_id: str, kind: str) -> list[str]:
        with self._lock:
            return [
                e["payload"]
                for e in self._events
                if e["event"] == "got" and e["cm_id"] == cm_id and e["kind"] == kind
            ]

    def _stats(self) -> dict[str, int]:
        found = [e for e in self._events if e["event"] == "stats"]
        return {k: v for k, v in found[-1].items() if k != "event"} if found else {}

    @property
    def stats(self) -> dict[str, int]:
        with self._lock:
            return self._stats()


def pause(receivers: Iterable[RxProcess]) -> None:
    """Stop them reading, and wait until none of them will read another message."""
    pending = [(rx.label, rx.request_mode(active=False)) for rx in receivers]
    for label, applied in pending:
        wait_for(applied, 30, f"{label} to pause")


class OutcomeListener:
    """Consumes the sender's outcome queue in a thread: what arrived, and when.

    The queue carries a CM's outcome and a Dependency-Sphere's; ``Sender.outcomes`` tells
    them apart (by the AMQP message type).
    """

    def __init__(self, sender: Sender, story: Story) -> None:
        self.sender = sender
        self.story = story
        self._arrived: dict[str, tuple[Outcome, datetime]] = {}
        self._spheres: dict[str, tuple[SphereOutcome, datetime]] = {}
        self._lock = threading.Lock()
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._run, name="outcomes", daemon=True)
        self._thread.start()

    def _run(self) -> None:
        while not self._stop.is_set():
            try:
                # Returns after half a second without a notification, to look at the flag.
                for outcome in self.sender.outcomes(timeout=0.5):
                    self._take(outcome)
                    if self._stop.is_set():
                        break
            except CondmsgError as exc:  # the broker went away: say so, try again
                self.story.say(f"   (outcome queue: {exc}; reconnecting)")
                self._stop.wait(1.0)

    def _take(self, outcome: Outcome | SphereOutcome) -> None:
        if isinstance(outcome, SphereOutcome):
            with self._lock:
                self._spheres[outcome.sphere_id] = (outcome, utcnow())
            self.story.sphere_outcome(outcome)
        else:
            with self._lock:
                self._arrived[outcome.cm_id] = (outcome, utcnow())
            self.story.outcome(outcome)

    def get(self, cm_id: str) -> Outcome | None:
        with self._lock:
            found = self._arrived.get(cm_id)
        return found[0] if found else None

    def sphere(self, sphere_id: str) -> SphereOutcome | None:
        with self._lock:
            found = self._spheres.get(sphere_id)
        return found[0] if found else None

    def stop(self) -> None:
        self._stop.set()
        self._thread.join(10)
