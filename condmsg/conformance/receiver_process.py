"""The receiver under test as a process: started from its shell command, stopped, and
watched for the exits the crash scenarios ask of it."""

from __future__ import annotations

import os
import signal
import subprocess
from contextlib import suppress
from typing import IO

from condmsg.conformance.config import ConformanceConfig


class ReceiverProcess:
    """The receiver under test, started with ``config.receiver_cmd`` in a shell of its own
    process group (so that a kill reaches whatever the command started)."""

    def __init__(self, config: ConformanceConfig, log: IO[bytes]) -> None:
        self._config = config
        self._log = log
        self._proc: subprocess.Popen[bytes] | None = None
        self.starts = 0

    def start(self) -> None:
        if self.exited() is None and self._proc is not None:
            raise RuntimeError("the receiver under test is running already")
        self._proc = subprocess.Popen(
            self._config.receiver_cmd,
            shell=True,
            env=self._config.receiver_env(),
            stdout=self._log,
            stderr=subprocess.STDOUT,
            start_new_session=True,
        )
        self.starts += 1

    def exited(self) -> int | None:
        return None if self._proc is None else self._proc.poll()

    def kill(self) -> None:
        """SIGKILL the process group at once (no chance to finish anything) and reap it."""
        proc, self._proc = self._proc, None
        if proc is None:
            return
        with suppress(ProcessLookupError):
            os.killpg(proc.pid, signal.SIGKILL)
        proc.wait()

    def stop(self, timeout_s: float = 10.0) -> None:
        """SIGTERM, then SIGKILL after ``timeout_s``."""
        proc, self._proc = self._proc, None
        if proc is None or proc.poll() is not None:
            return
        for sig, wait_s in ((signal.SIGTERM, timeout_s), (signal.SIGKILL, 5.0)):
            try:
                os.killpg(proc.pid, sig)
            except ProcessLookupError:
                return
            try:
                proc.wait(wait_s)
                return
            except subprocess.TimeoutExpired:
                continue
