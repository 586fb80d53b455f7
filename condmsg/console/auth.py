"""Who may change state through the console: a token, a session, a CSRF token per session.

Reading needs nothing. An action (requeue, purge) needs a session opened with the
console's token (``--token`` / ``CONDMSG_CONSOLE_TOKEN``, compared in constant time) and
the session's CSRF token in the form, also compared in constant time: a page of another
site can make a browser post to the console, but cannot read the CSRF token it would
need. Sessions live in this process's memory only, so restarting the console logs
everybody out; the cookie is HttpOnly and SameSite=Strict (and Secure behind TLS).

Guessing is bounded twice: the token must be long enough that guessing is hopeless
(:func:`check_token`), and a client address that fails :data:`MAX_FAILURES` logins within
:data:`FAILURE_WINDOW_S` is answered 429 for :data:`LOCKOUT_S` (:class:`LoginThrottle`),
whatever it offers then.
"""

from __future__ import annotations

import hmac
import secrets
import threading
import time
from collections.abc import Callable
from dataclasses import dataclass

from condmsg.core.errors import ConfigError

COOKIE = "condmsg_console_session"
#: A session ends after this long (seconds), however busy.
SESSION_TTL_S = 8 * 3600
#: The shortest token the console accepts (characters): ``secrets.token_urlsafe(32)`` gives
#: 43, ``condmsg secret new`` 64.
MIN_TOKEN_CHARS = 32
HOW_TO_MAKE_TOKEN = (
    "make one with: condmsg secret new "
    "(or: python3 -c 'import secrets; print(secrets.token_urlsafe(32))')"
)
#: Failed logins from one client address within :data:`FAILURE_WINDOW_S` seconds that lock
#: it out for :data:`LOCKOUT_S` seconds.
MAX_FAILURES = 5
FAILURE_WINDOW_S = 300.0
LOCKOUT_S = 300.0
#: Client addresses the throttle remembers at most (a flood of addresses cannot grow the
#: console's memory without bound; the oldest entries are forgotten first).
MAX_TRACKED = 10_000


def check_token(token: str) -> str:
    """``token``, or :class:`ConfigError` if it is too short to be a secret (the message
    never repeats it)."""
    if len(token) < MIN_TOKEN_CHARS:
        raise ConfigError(
            f"the console token is too short ({len(token)} characters; at least "
            f"{MIN_TOKEN_CHARS} are needed); {HOW_TO_MAKE_TOKEN}"
        )
    return token


@dataclass(frozen=True, slots=True)
class Session:
    csrf: str
    expires: float


class Sessions:
    def __init__(self, token: str | None, clock: Callable[[], float] = time.monotonic) -> None:
        self._token = token
        self._clock = clock
        self._lock = threading.Lock()
        self._sessions: dict[str, Session] = {}

    @property
    def enabled(self) -> bool:
        """Whether actions are possible at all (a token was configured)."""
        return bool(self._token)

    def login(self, offered: str) -> str | None:
        """A new session id if ``offered`` is the token, else None."""
        if not self._token or not hmac.compare_digest(offered.encode(), self._token.encode()):
            return None
        session_id = secrets.token_urlsafe(32)
        with self._lock:
            now = self._clock()
            self._sessions = {k: s for k, s in self._sessions.items() if s.expires > now}
            self._sessions[session_id] = Session(secrets.token_urlsafe(32), now + SESSION_TTL_S)
        return session_id

    def get(self, session_id: str | None) -> Session | None:
        if not session_id:
            return None
        with self._lock:
            found = self._sessions.get(session_id)
        if found is None or found.expires <= self._clock():
            return None
        return found

    def logout(self, session_id: str | None) -> None:
        with self._lock:
            self._sessions.pop(session_id or "", None)

    def check_csrf(self, session_id: str | None, offered: str) -> bool:
        found = self.get(session_id)
        return found is not None and hmac.compare_digest(found.csrf.encode(), offered.encode())


@dataclass(slots=True)
class _Failures:
    count: int
    since: float
    locked_until: float = 0.0


class LoginThrottle:
    """Failed logins per client address; ``clock`` is monotonic seconds.

    Behind a reverse proxy every client has the proxy's address, so a lockout there locks
    out everybody for :data:`LOCKOUT_S`: the price of not trusting a forwarded address that
    any client can write.
    """

    def __init__(self, clock: Callable[[], float] = time.monotonic) -> None:
        self._clock = clock
        self._lock = threading.Lock()
        self._failures: dict[str, _Failures] = {}

    def retry_after(self, client: str) -> float | None:
        """Seconds until ``client`` may try again, or None if it may now."""
        with self._lock:
            found = self._failures.get(client)
        if found is None:
            return None
        left = found.locked_until - self._clock()
        return left if left > 0 else None

    def failed(self, client: str) -> None:
        now = self._clock()
        with self._lock:
            found = self._failures.pop(client, None)
            if found is None or now - found.since > FAILURE_WINDOW_S:
                found = _Failures(0, now)
            found.count += 1
            if found.count >= MAX_FAILURES:
                found.locked_until = now + LOCKOUT_S
            self._failures[client] = found  # re-inserted: the dict is oldest first
            while len(self._failures) > MAX_TRACKED:
                del self._failures[next(iter(self._failures))]

    def succeeded(self, client: str) -> None:
        with self._lock:
            self._failures.pop(client, None)
