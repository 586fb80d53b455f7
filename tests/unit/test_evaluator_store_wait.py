"""The evaluator waiting for its database at start logs as every service does: the
failure once (a reminder a minute while it lasts), and once when the store opens."""

from __future__ import annotations

import logging
import threading
from pathlib import Path

import pytest
import sqlalchemy as sa

from condmsg.runtime.db import make_engine
from evaluator import store_setup
from evaluator.store_setup import SenderStore


def test_a_database_that_stays_down_for_several_tries_is_logged_once(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, caplog: pytest.LogCaptureFixture
) -> None:
    monkeypatch.setattr(store_setup, "FIRST_RETRY_S", 0.001)
    monkeypatch.setattr(store_setup, "MAX_RETRY_S", 0.001)
    engine = make_engine(f"sqlite:///{tmp_path / 'x.db'}")
    store = SenderStore(engine, secret=b"k" * 32, create=True, stop=threading.Event())
    tries = 0
    prepare = store.prepare

    def down_four_times() -> None:
        nonlocal tries
        tries += 1
        if tries <= 4:
            raise sa.exc.OperationalError("SELECT 1", {}, Exception("connection refused"))
        prepare()

    monkeypatch.setattr(store, "prepare", down_four_times)
    caplog.set_level(logging.INFO, logger="evaluator.store_setup")
    assert store.wait_until_prepared()
    engine.dispose()
    lines = [r.getMessage() for r in caplog.records if r.name == "evaluator.store_setup"]
    assert tries == 5
    assert len(lines) == 2, lines
    assert "failed: connection refused" in lines[0] and "x.db" in lines[0]
    assert "works again after 4 failed tries" in lines[1]
