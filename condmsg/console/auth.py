"""Who may change state through the console: a token, a session, a CSRF token per session.

Reading needs nothing. An action (requeue, purge) needs a session opened with the
console's token (``--token`` / ``CONDMSG_CONSOLE_TOKEN``, compared in constant time) and
the session's CSRF token in the form, also compared in constant time: a page of another
site can make a browser post to the console, but cannot read the CSRF token it would
need. Sessions live in this process's memory only, so restarting the console logs
everybody out; the cookie is HttpOnly and SameSite=Strict.
"""

from __future__ import annotations

import hmac
import secrets
import threading
import time
from dataclasses import dataclass

COOKIE = "condmsg_console_session"
#: A session ends after this long (seconds), however busy.
SESSION_TTL_S = 8 * 3600


@dataclass(frozen=True, slots=True)
class Session:
    csrf: str
    expires: float


class Sessions:
    def __init__(self, token: str | None) -> None:
        self._token = token
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
            now = time.monotonic()
            self._sessions = {k: s for k, s in self._sessions.items() if s.expires > now}
            self._sessions[session_id] = Session(secrets.token_urlsafe(32), now + SESSION_TTL_S)
        return session_id

    def get(self, session_id: str | None) -> Session | None:
        if not session_id:
            return None
        with self._lock:
            found = self._sessions.get(session_id)
        if found is None or found.expires <= time.monotonic():
            return None
        return found

    def logout(self, session_id: str | None) -> None:
        with self._lock:
            self._sessions.pop(session_id or "", None)

    def check_csrf(self, session_id: str | None, offered: str) -> bool:
        found = self.get(session_id)
        return found is not None and hmac.compare_digest(found.csrf.encode(), offered.encode())
