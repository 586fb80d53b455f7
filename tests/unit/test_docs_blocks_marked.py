"""Every fenced block of README.md and docs/*.md is run by a test or marked as an excerpt
(the rule in tests/docs_blocks.py and docs/index.md), and docs/index.md links every page."""

from __future__ import annotations

import re
from pathlib import Path

import pytest

from tests.docs_blocks import ROOT, all_blocks, check, parse, runnable_blocks


def test_every_block_is_run_by_a_test_or_marked_as_an_excerpt() -> None:
    blocks, problems = all_blocks()
    problems += [p for p in (check(b) for b in blocks) if p is not None]
    assert not problems, "\n".join(problems)


@pytest.mark.parametrize("page", ["docs/concepts.md", "docs/sending.md", "docs/receiving.md"])
def test_each_guide_page_has_blocks_that_run(page: str) -> None:
    assert any(b.page == page for b in runnable_blocks()), page


def test_the_index_links_every_page_and_the_readme_links_the_index() -> None:
    index = (ROOT / "docs" / "index.md").read_text(encoding="utf-8")
    linked = set(re.findall(r"\]\(([\w.-]+\.(?:md|json))\)", index))
    pages = {p.name for p in (ROOT / "docs").iterdir() if p.suffix in (".md", ".json")}
    assert pages - {"index.md"} <= linked, sorted(pages - {"index.md"} - linked)
    assert "(docs/index.md)" in (ROOT / "README.md").read_text(encoding="utf-8")


# -- the rule itself, on pages made for the purpose ------------------------------------


def _problems(tmp_path: Path, text: str) -> list[str]:
    (tmp_path / "docs").mkdir(exist_ok=True)
    page = tmp_path / "docs" / "page.md"
    page.write_text(text, encoding="utf-8")
    blocks, problems = parse(page, tmp_path)
    return problems + [p for p in (check(b, tmp_path) for b in blocks) if p is not None]


def test_an_unmarked_python_block_is_run_and_a_marked_one_is_not(tmp_path: Path) -> None:
    text = "```python\nx = 1\n```\n\n<!-- excerpt -->\n```python\nrelay.start(); ...\n```\n"
    (tmp_path / "docs").mkdir()
    (tmp_path / "docs" / "page.md").write_text(text, encoding="utf-8")
    blocks, problems = parse(tmp_path / "docs" / "page.md", tmp_path)
    assert problems == []
    assert [(b.line, b.runs_here, b.source) for b in blocks] == [
        (1, True, "x = 1\n"),
        (6, False, "relay.start(); ...\n"),
    ]


def test_a_block_in_a_list_item_loses_the_item_s_indentation(tmp_path: Path) -> None:
    text = "- item\n\n  ```python\n  if True:\n      x = 1\n  ```\n"
    (tmp_path / "docs").mkdir()
    (tmp_path / "docs" / "page.md").write_text(text, encoding="utf-8")
    blocks, _ = parse(tmp_path / "docs" / "page.md", tmp_path)
    assert blocks[0].source == "if True:\n    x = 1\n"


@pytest.mark.parametrize(
    ("text", "problem"),
    [
        ("```sh\nmake test\n```\n", "a sh block must be marked"),
        ("```\noutput\n```\n", "a plain block must be marked"),
        ("```python\nsender.send(...\n```\n", "does not compile"),
        ("<!-- excerpt -->\n\n```sh\nmake\n```\n", "is not right before a fence"),
        ("<!-- excerpt: later -->\n```sh\nmake\n```\n", "unknown marker"),
        ("<!-- run by tests/nowhere.py -->\n```sh\nmake\n```\n", "is not a test file"),
        ("<!-- Excerpt -->\n```sh\nmake\n```\n", "a marker must read"),
        ("```python\nx = 1\n", "never closed"),
    ],
)
def test_what_breaks_the_rule(tmp_path: Path, text: str, problem: str) -> None:
    problems = _problems(tmp_path, text)
    assert any(problem in p for p in problems), problems


def test_a_run_by_marker_needs_a_test_that_names_the_page(tmp_path: Path) -> None:
    (tmp_path / "tests").mkdir()
    test = tmp_path / "tests" / "test_page.py"
    marked = "<!-- run by tests/test_page.py -->\n```python\nx = 1\n```\n"
    test.write_text("# runs nothing\n", encoding="utf-8")
    assert any("does not name docs/page.md" in p for p in _problems(tmp_path, marked))
    test.write_text("PAGE = 'docs/page.md'\n", encoding="utf-8")
    assert _problems(tmp_path, marked) == []
