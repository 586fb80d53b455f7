"""The result of a conformance run: a pass/fail table for people, one JSON line for CI."""

from __future__ import annotations

import json
from dataclasses import dataclass


@dataclass(frozen=True, slots=True, kw_only=True)
class ScenarioResult:
    name: str
    passed: bool
    note: str
    seconds: float


@dataclass(frozen=True, slots=True, kw_only=True)
class Report:
    results: tuple[ScenarioResult, ...]
    seconds: float

    @property
    def passed(self) -> bool:
        return bool(self.results) and all(r.passed for r in self.results)

    @property
    def failures(self) -> tuple[ScenarioResult, ...]:
        return tuple(r for r in self.results if not r.passed)

    def table(self) -> str:
        width = max((len(r.name) for r in self.results), default=8)
        lines = [f"{'scenario':<{width}}  result  seconds  note"]
        for r in self.results:
            mark = "pass" if r.passed else "FAIL"
            lines.append(f"{r.name:<{width}}  {mark:<6}  {r.seconds:7.1f}  {r.note}")
        verdict = "PASSED" if self.passed else f"FAILED ({len(self.failures)} scenarios)"
        lines.append(f"{len(self.results)} scenarios in {self.seconds:.1f}s: {verdict}")
        return "\n".join(lines)

    def json_line(self) -> str:
        return json.dumps(
            {
                "conformance": "pass" if self.passed else "fail",
                "passed": sum(r.passed for r in self.results),
                "failed": len(self.failures),
                "seconds": round(self.seconds, 1),
                "scenarios": {
                    r.name: {"passed": r.passed, "seconds": round(r.seconds, 1), "note": r.note}
                    for r in self.results
                },
            },
            ensure_ascii=False,
        )
