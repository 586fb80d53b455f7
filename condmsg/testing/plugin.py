"""The test kit's pytest plugin (the ``condmsg`` entry point of ``pytest11``): the
``condmsg_kit`` fixture, a fresh :class:`~condmsg.testing.kit.Kit` per test, closed
after it."""

from __future__ import annotations

from collections.abc import Iterator
from typing import TYPE_CHECKING

import pytest

if TYPE_CHECKING:
    from condmsg.testing.kit import Kit


@pytest.fixture
def condmsg_kit() -> Iterator[Kit]:
    """A :class:`~condmsg.testing.kit.Kit` for sender ``app``, its clock at its start."""
    from condmsg.testing.kit import Kit  # loaded only by tests that use the kit

    with Kit() as kit:
        yield kit
