"""Running the scenarios against a receiver under test."""

from __future__ import annotations

import time
import traceback
from concurrent.futures import ThreadPoolExecutor

from condmsg.conformance.config import ConformanceConfig
from condmsg.conformance.report import Report, ScenarioResult
from condmsg.conformance.scenarios import ALL, CONCURRENT, SERIAL, Scenario
from condmsg.conformance.world import NotMet, World, world

#: Scenarios running side by side: enough to overlap their waits for deadlines, few
#: enough that the receiver under test sees a modest load.
PARALLEL = 8


def run(config: ConformanceConfig) -> Report:
    """Start the receiver under test, run the scenarios (``config.only``, else all), stop
    it; a scenario that cannot even start (the receiver does not come up) fails them all."""
    unknown = sorted(set(config.only) - set(ALL))
    if unknown:
        raise ValueError(f"unknown scenarios {', '.join(unknown)}; known: {', '.join(ALL)}")
    wanted = set(config.only or ALL)
    started = time.monotonic()
    with world(config) as w:
        try:
            w.start_receiver()
        except NotMet as exc:
            failed = [ScenarioResult(name=n, passed=False, note=str(exc), seconds=0.0) for n in ALL]
            return Report(results=tuple(r for r in failed if r.name in wanted), seconds=0.0)
        concurrent = [(n, s) for n, s in CONCURRENT.items() if n in wanted]
        with ThreadPoolExecutor(PARALLEL, thread_name_prefix="conformance") as pool:
            results = list(pool.map(lambda item: _one(w, *item), concurrent))
        for name, scenario in SERIAL.items():
            if name in wanted:
                results.append(_one(w, name, scenario))
    return Report(results=tuple(results), seconds=time.monotonic() - started)


def _one(w: World, name: str, scenario: Scenario) -> ScenarioResult:
    started = time.monotonic()
    try:
        note, passed = scenario(w), True
    except NotMet as exc:
        note, passed = str(exc), False
    except Exception as exc:  # the harness's own trouble fails the scenario, not the run
        note, passed = f"harness error: {exc!r}", False
        traceback.print_exc()
    return ScenarioResult(name=name, passed=passed, note=note, seconds=time.monotonic() - started)
