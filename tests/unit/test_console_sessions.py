"""The console's sessions compare tokens and CSRF tokens exactly."""

from __future__ import annotations


def test_a_session_needs_the_exact_token_and_its_own_csrf_token() -> None:
    from condmsg.console.auth import Sessions

    sessions = Sessions("s3cret")
    assert sessions.login("s3cre") is None and sessions.login("s3cret!") is None
    session_id = sessions.login("s3cret")
    assert session_id is not None
    found = sessions.get(session_id)
    assert found is not None
    assert sessions.check_csrf(session_id, found.csrf)
    assert not sessions.check_csrf(session_id, found.csrf[:-1])
    assert not sessions.check_csrf("another", found.csrf)
    sessions.logout(session_id)
    assert sessions.get(session_id) is None
    assert not Sessions(None).enabled and Sessions(None).login("") is None
