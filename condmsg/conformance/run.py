"""Running the scenarios against a receiver under test."""

from __future__ import annotations

import time
import traceback
from concurrent.futures import FIRST_COMPLETED, Future, ThreadPoolExecutor, wait

from condmsg.conformance.config import ConformanceConfig
from condmsg.conformance.report import Report, ScenarioResult
from condmsg.conformance.scenarios import ALL, CONCURRENT, SERIAL, Scenario
from condmsg.conformance.world import NotMet, Stopped, World, world
from condmsg.core.errors import ConfigError

#: Scenarios running side by side: enough to overlap their waits for deadlines, few
#: enough that the receiver under test sees a modest load.
PARALLEL = 8


def check_names(names: tuple[str, ...]) -> None:
    """Raise :class:`ConfigError` (one line naming the known ones) for unknown scenarios."""
    unknown = sorted(set(names) - set(ALL))
    if unknown:
        raise ConfigError(f"unknown scenarios {', '.join(unknown)}; known: {', '.join(ALL)}")


def run(config: ConformanceConfig) -> Report:
    """Start the receiver under test, run the scenarios (``config.only``, else all), stop
    it; a scenario that cannot even start (the receiver does not come up) fails them all.

    With ``config.fail_fast`` the run stops at the first failed scenario: the scenarios
    still running are cut short and left out of the report, the others are not started.
    """
    check_names(config.only)
    wanted = set(config.only or ALL)
    started = time.monotonic()
    with world(config) as w:
        try:
            w.start_receiver()
        except NotMet as exc:
            failed = [ScenarioResult(name=n, passed=False, note=str(exc), seconds=0.0) for n in ALL]
            return Report(results=tuple(r for r in failed if r.name in wanted), seconds=0.0)
        concurrent = [(n, s) for n, s in CONCURRENT.items() if n in wanted]
        results = _side_by_side(w, concurrent)
        for name, scenario in SERIAL.items():
            if name in wanted and not w.abort.is_set():
                result = _one(w, name, scenario)
                results.append(result)
                if result is not None and not result.passed and config.fail_fast:
                    w.abort.set()
    judged = tuple(r for r in results if r is not None)
    return Report(results=judged, seconds=time.monotonic() - started)


def _side_by_side(w: World, scenarios: list[tuple[str, Scenario]]) -> list[ScenarioResult | None]:
    """Run ``scenarios`` concurrently; results in their order (None: cut short)."""
    with ThreadPoolExecutor(PARALLEL, thread_name_prefix="conformance") as pool:
        futures: list[Future[ScenarioResult | None]] = [
            pool.submit(_one, w, name, scenario) for name, scenario in scenarios
        ]
        pending = set(futures)
        while pending:
            done, pending = wait(pending, return_when=FIRST_COMPLETED)
            failed = any((r := f.result()) is not None and not r.passed for f in done)
            if failed and w.config.fail_fast:
                w.abort.set()
        return [f.result() for f in futures]


def _one(w: World, name: str, scenario: Scenario) -> ScenarioResult | None:
    if w.abort.is_set():
        return None
    started = time.monotonic()
    try:
        note, passed = scenario(w), True
    except Stopped:
        return None
    except NotMet as exc:
        note, passed = str(exc), False
    except Exception as exc:  # the harness's own trouble fails the scenario, not the run
        note, passed = f"harness error: {exc!r}", False
        traceback.print_exc()
    return ScenarioResult(name=name, passed=passed, note=note, seconds=time.monotonic() - started)
