"""When the relay claims next, and from where: a pure object, no I/O, its clock passed in.

Where a claim starts: while draining a backlog the relay claims behind its previous batch
(``id > cursor``), so it never re-walks the index entries of rows it just deleted. After
catching up, after a broker or database failure, and every ``rescan_interval_s`` it starts
again from the lowest id, which picks up rows that committed late (a lower id committing
after a higher one), rows a crashed relay let go, and nacked rows whose retry time has
come. Without row locks (SQLite) that rescan waits until nothing is in flight, because it
would otherwise claim rows the relay is still publishing.

When a claim is made: while the last one came back full (more may wait), after a wake-up
(a NOTIFY, :meth:`ClaimSchedule.wake`), when the poll interval has passed since the last
claim from the head, and when someone waits for the relay to be idle. After a failed
claim, not before the store's backoff has passed.

Idleness is proved, not guessed: a waiter takes a ticket (:meth:`ClaimSchedule.want_idle`)
and is served once a claim *taken after it* from the head came back empty with nothing in
flight. Wake-ups are counted, not flagged, so one arriving during a claim is never lost.

The relay calls this object from its loop thread; :meth:`wake`, :meth:`want_idle` and
:meth:`idle_since` may come from other threads, so the relay holds its lock around them and
around :meth:`next_claim` and :meth:`claimed`, which read what they change.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass

from condmsg.infra.backoff import Backoff


@dataclass(frozen=True, slots=True, kw_only=True)
class PlannedClaim:
    """One claim to make: rows with ``id > after_id`` (0: from the head).

    ``ticket``: the wake-ups it answers; ``at``: when it was planned (the clock's seconds).
    """

    after_id: int
    ticket: int
    at: float

    @property
    def from_head(self) -> bool:
        return self.after_id == 0


class ClaimSchedule:
    """The claim schedule of one relay; see the module docstring.

    ``batch_size`` is the most rows a claim takes (a full batch means more may wait);
    ``poll_interval_s`` and ``rescan_interval_s`` are seconds of ``clock`` (a monotonic
    clock); ``locking`` says whether the store locks claimed rows (PostgreSQL).
    """

    def __init__(
        self,
        *,
        batch_size: int,
        poll_interval_s: float,
        rescan_interval_s: float,
        locking: bool,
        clock: Callable[[], float],
        backoff: Backoff | None = None,
    ) -> None:
        self._batch_size = batch_size
        self._poll_interval_s = poll_interval_s
        self._rescan_interval_s = rescan_interval_s
        self._locking = locking
        self._clock = clock
        self._backoff = backoff if backoff is not None else Backoff(0.2, 10.0)
        self._cursor = 0
        self._rescan = True
        self._more = True
        self._next_claim_at = 0.0
        self._next_poll_at = 0.0
        self._last_rescan_at = 0.0
        self._wake_seq = 0
        self._seen_seq = 0
        self._idle_through = -1
        self._drain_target = -1

    # -- from any thread (under the relay's lock) ---------------------------------------------

    def wake(self) -> None:
        """Something may have become claimable: claim at the next turn."""
        self._wake_seq += 1

    def want_idle(self) -> int:
        """A ticket for proof of idleness: served (:meth:`idle_since`) by an empty claim
        from the head, nothing in flight, that starts after this call."""
        self._wake_seq += 1
        self._drain_target = max(self._drain_target, self._wake_seq)
        return self._wake_seq

    def idle_since(self, ticket: int) -> bool:
        """Whether idleness has been proved for ``ticket``."""
        return self._idle_through >= ticket

    # -- from the loop thread -----------------------------------------------------------------

    def next_claim(self, in_flight: int) -> PlannedClaim | None:
        """The claim to make now with ``in_flight`` batches awaiting confirms, or None:
        none is due (see the module docstring for when one is)."""
        now = self._clock()
        if now < self._next_claim_at:
            return None
        ticket = self._wake_seq
        proving = not in_flight and self._idle_through < self._drain_target
        wanted = self._more or ticket != self._seen_seq or now >= self._next_poll_at
        if proving:
            self._rescan = True
        if not (wanted or proving):
            return None
        if now - self._last_rescan_at >= self._rescan_interval_s:
            self._rescan = True
        if self._rescan and self._cursor and (self._locking or not in_flight):
            self._cursor = 0
        return PlannedClaim(after_id=self._cursor, ticket=ticket, at=now)

    def claimed(self, claim: PlannedClaim, *, rows: int, last_id: int, in_flight: int) -> bool:
        """``claim`` took ``rows`` rows, the last ``last_id``, with ``in_flight`` batches
        awaiting confirms besides: True if that proved idleness (wake the waiters)."""
        self._backoff.reset()
        self._seen_seq = claim.ticket
        if claim.from_head:
            self._rescan = False
            self._last_rescan_at = claim.at
            self._next_poll_at = claim.at + self._poll_interval_s
        self._more = rows == self._batch_size
        if not rows:
            if claim.from_head and not in_flight:
                self._idle_through = max(self._idle_through, claim.ticket)
                return True
            self._rescan = True
            return False
        if not self._more:
            self._rescan = True
        self._cursor = last_id
        return False

    def claim_failed(self, claim: PlannedClaim) -> None:
        """``claim`` failed in the database: the next waits for the store's backoff."""
        self._next_claim_at = claim.at + self._backoff.next_delay()

    def rescan(self) -> None:
        """Rows went back to pending (a settle failed): the next claim starts at the head."""
        self._rescan = True

    def restart(self) -> None:
        """Batches came back unpublished, or the broker connection is new: claim from the
        head, and keep claiming until a claim comes back short."""
        self._rescan = self._more = True

    def until_poll_s(self) -> float:
        """Seconds until the poll interval makes a claim due (0: it is due)."""
        return max(0.0, self._next_poll_at - self._clock())
