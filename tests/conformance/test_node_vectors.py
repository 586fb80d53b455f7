"""The Node receiver's judging agrees with the protocol's test vectors
(``node interop/node/vectors.js``), so a vector changed for Python is held to Node too."""

from __future__ import annotations

import shutil
import subprocess

import pytest

from tests.conformance.conftest import NODE_DIR


def test_the_node_receiver_judges_every_vector_as_the_protocol_says() -> None:
    node = shutil.which("node")
    if node is None:
        pytest.fail("the Node receiver's vectors need node (make test installs it)")
    result = subprocess.run(
        [node, str(NODE_DIR / "vectors.js")], capture_output=True, text=True, timeout=60
    )
    assert result.returncode == 0, result.stdout + result.stderr
    assert ", 0 differ" in result.stdout, result.stdout
