"""The fenced code blocks of the user docs (README.md and docs/*.md), and how each is tested.

The rule (stated for contributors in docs/index.md): a block is one of

* a ``python`` block without a marker: run by ``tests/integration/docs/test_docs_blocks.py``,
  alone, in a fresh process, against the real RabbitMQ and PostgreSQL;
* a block of any language preceded by the line ``<!-- excerpt -->``: not run (a fragment,
  a shell session, a file's contents, output, a signature list);
* a block preceded by ``<!-- run by tests/PATH.py -->``: run by that test, which must exist
  and name the page.

Anything else (a block of another language without a marker, a marker that is not on the
line right before a fence, an unknown marker, an unclosed fence) is an error.
"""

from __future__ import annotations

import ast
import re
from dataclasses import dataclass
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]

EXCERPT = "excerpt"
RUN_BY = "run by"

_FENCE = re.compile(r"^(?P<indent>\s*)(?P<fence>`{3,}|~{3,})(?P<info>.*)$")
_MARKER = re.compile(r"^\s*<!--\s*(?P<text>(?:excerpt|run by)\b.*?)\s*-->\s*$")
#: What looks like a marker but may be misspelt (case, spacing): reported, never ignored.
_ANY_MARKER = re.compile(r"^\s*<!--\s*(?:excerpt|run\s+by)\b", re.IGNORECASE)


@dataclass(frozen=True, slots=True)
class Block:
    """One fenced block: where it is, its language, its text and its marker (if any)."""

    page: str  # relative to the repository root, e.g. "docs/sending.md"
    line: int  # of the opening fence, 1-based
    language: str  # the info string's first word, "" without one
    source: str
    marker: str | None  # "excerpt", "run by tests/...", or None

    @property
    def id(self) -> str:
        return f"{self.page}:{self.line}"

    @property
    def runs_here(self) -> bool:
        """Run by tests/integration/docs/test_docs_blocks.py."""
        return self.marker is None and self.language == "python"

    @property
    def run_by(self) -> str | None:
        """The test file named by a ``run by`` marker."""
        if self.marker is None or not self.marker.startswith(RUN_BY + " "):
            return None
        return self.marker[len(RUN_BY) + 1 :].strip()


def pages(root: Path = ROOT) -> list[Path]:
    return [root / "README.md", *sorted((root / "docs").glob("*.md"))]


def parse(path: Path, root: Path = ROOT) -> tuple[list[Block], list[str]]:
    """The blocks of one page, and the problems of its markers and fences."""
    page = path.relative_to(root).as_posix()
    lines = path.read_text(encoding="utf-8").splitlines()
    blocks: list[Block] = []
    problems: list[str] = []
    i = 0
    while i < len(lines):
        line = lines[i]
        marker = _MARKER.match(line)
        if marker is None and _ANY_MARKER.match(line):
            problems.append(
                f"{page}:{i + 1}: a marker must read <!-- excerpt --> or "
                "<!-- run by tests/PATH.py -->"
            )
        fence = _FENCE.match(line)
        if marker is not None:
            text = " ".join(marker["text"].split())
            if text != EXCERPT and not text.startswith(RUN_BY + " "):
                problems.append(f"{page}:{i + 1}: unknown marker {line.strip()!r}")
            if i + 1 >= len(lines) or _FENCE.match(lines[i + 1]) is None:
                problems.append(f"{page}:{i + 1}: {line.strip()} is not right before a fence")
        if fence is None:
            i += 1
            continue
        # A fence indented in a list item: its lines lose that indentation.
        opening, indent = fence["fence"], len(fence["indent"])
        language = (fence["info"].split() or [""])[0]
        previous = _MARKER.match(lines[i - 1]) if i > 0 else None
        body: list[str] = []
        j = i + 1
        while j < len(lines):
            closing = _FENCE.match(lines[j])
            if (
                closing is not None
                and closing["fence"][0] == opening[0]
                and len(closing["fence"]) >= len(opening)
                and not closing["info"].strip()
            ):
                break
            text = lines[j]
            body.append(text[min(indent, len(text) - len(text.lstrip())) :])
            j += 1
        else:
            problems.append(f"{page}:{i + 1}: the fence is never closed")
        blocks.append(
            Block(
                page=page,
                line=i + 1,
                language=language,
                source="\n".join(body) + "\n",
                marker=" ".join(previous["text"].split()) if previous is not None else None,
            )
        )
        i = j + 1
    return blocks, problems


def all_blocks(root: Path = ROOT) -> tuple[list[Block], list[str]]:
    blocks: list[Block] = []
    problems: list[str] = []
    for path in pages(root):
        found, wrong = parse(path, root)
        blocks += found
        problems += wrong
    return blocks, problems


def check(block: Block, root: Path = ROOT) -> str | None:
    """Why ``block`` breaks the rule, or None."""
    if block.marker == EXCERPT:
        return None
    if block.run_by is not None:
        test = root / block.run_by
        if not block.run_by.startswith("tests/") or not test.is_file():
            return f"{block.id}: {block.run_by} is not a test file"
        if Path(block.page).name not in test.read_text(encoding="utf-8"):
            return f"{block.id}: {block.run_by} does not name {block.page}"
        return None
    if block.marker is not None:
        return f"{block.id}: unknown marker {block.marker!r}"
    if block.language != "python":
        return (
            f"{block.id}: a {block.language or 'plain'} block must be marked "
            "<!-- excerpt --> (or <!-- run by tests/PATH.py -->)"
        )
    try:
        ast.parse(block.source, filename=block.id)
    except SyntaxError as exc:
        return f"{block.id}: does not compile ({exc.msg}, line {exc.lineno}); mark it excerpt"
    return None


def runnable_blocks(root: Path = ROOT) -> list[Block]:
    """The blocks tests/integration/docs/test_docs_blocks.py runs."""
    return [b for b in all_blocks(root)[0] if b.runs_here]


def names_in(source: str) -> set[str]:
    """Every string literal of a block that could name a queue or a sender."""
    return {
        node.value
        for node in ast.walk(ast.parse(source))
        if isinstance(node, ast.Constant)
        and isinstance(node.value, str)
        and 0 < len(node.value.encode()) <= 200
        and not any(c.isspace() for c in node.value)
    }
