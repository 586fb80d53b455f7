"""What a command reads from the user: files, standard input, and condition documents
written as JSON or YAML, in a file or inline."""

from __future__ import annotations

import json
import sys
from pathlib import Path
from typing import Any

from condmsg.core.condition_codec import MAX_DOCUMENT_BYTES, SCHEMA_VERSION, condition_from_dict
from condmsg.core.conditions import MAX_DEPTH, Condition
from condmsg.core.errors import ConditionError, ConfigError

#: What names standard input in place of a file.
STDIN = "-"


def read_bytes(spec: str) -> bytes:
    """The bytes of the file ``spec``, or of standard input for ``-`` (``OSError`` for a
    file that cannot be read: the command says which)."""
    if spec == STDIN:
        return sys.stdin.buffer.read()
    return Path(spec).read_bytes()


def _looks_inline(spec: str) -> bool:
    """A document given on the command line rather than a file name: JSON and YAML flow
    mappings start with ``{``; a YAML block mapping has ``key: value`` on a line."""
    text = spec.strip()
    return text.startswith("{") or ": " in text or "\n" in text


def condition_text(spec: str) -> bytes:
    """The condition document ``spec`` names: standard input (``-``), an existing file,
    or the document itself."""
    if not spec.strip():
        # Path("") is the current directory: it would be read as one.
        raise ConfigError(
            "--condition is empty: give a file, - for standard input, or the document itself"
        )
    if spec == STDIN or Path(spec).exists() or not _looks_inline(spec):
        return read_bytes(spec)
    return spec.encode()


def parse_condition(document: bytes) -> Condition:
    """A condition from a JSON or YAML document; :class:`ConditionError` naming what is
    wrong otherwise.

    The document is the versioned one ``condition_to_json`` writes (``{"schema": 1,
    "condition": {...}}``) or, as people write by hand, its ``condition`` alone (a node
    with a ``type``), which reads as schema version 1.
    """
    if len(document) > MAX_DOCUMENT_BYTES:
        raise ConditionError(f"condition: the document is longer than {MAX_DOCUMENT_BYTES} bytes")
    data = _decode(document)
    if isinstance(data, dict) and "schema" not in data and "type" in data:
        data = {"schema": SCHEMA_VERSION, "condition": data}
    return condition_from_dict(data)


def _looks_like_json(document: bytes) -> bool:
    """Written as JSON: an array, or an object whose first key is quoted (a YAML flow
    mapping such as ``{type: destination, ...}`` starts with ``{`` too, unquoted)."""
    text = document.lstrip()
    return text[:1] == b"[" or (text[:1] == b"{" and text[1:].lstrip()[:1] in (b'"', b"}"))


def _decode(document: bytes) -> Any:
    try:
        return json.loads(document)
    except json.JSONDecodeError as exc:
        if _looks_like_json(document):
            # YAML would read some broken JSON (``{"name": }``) as something else, and
            # the error would then be about the condition rather than the syntax.
            raise ConditionError(
                f"condition: not valid JSON ({exc.msg} at line {exc.lineno}, column {exc.colno})"
            ) from None
    except (ValueError, RecursionError):
        pass  # not JSON: YAML, of which JSON is nearly a subset, says what is wrong
    import yaml

    try:
        return yaml.safe_load(document)
    except yaml.YAMLError as exc:
        raise ConditionError(f"condition: neither JSON nor YAML ({_short(exc)})") from None
    except RecursionError:
        raise ConditionError(
            f"condition: nested too deeply (a tree has at most {MAX_DEPTH} levels)"
        ) from None


def _short(exc: Exception) -> str:
    """A YAML error in one line (PyYAML spreads it over several, with a source excerpt)."""
    mark = getattr(exc, "problem_mark", None)
    problem = getattr(exc, "problem", None) or str(exc).splitlines()[0]
    if mark is not None:
        return f"{problem} at line {mark.line + 1}, column {mark.column + 1}"
    return str(problem)


def exclusive_stdin(**specs: str | None) -> None:
    """Standard input can feed one option only; :class:`ConfigError` if two ask for it."""
    takers = [f"--{name}" for name, spec in specs.items() if spec == STDIN]
    if len(takers) > 1:
        raise ConfigError(f"only one of {' and '.join(takers)} can read standard input (-)")
