"""Settings and fixtures of the fuzzing suite.

The number of generated examples comes from ``CONDMSG_FUZZ_EXAMPLES`` (default
:data:`DEFAULT_EXAMPLES`): small in ``make test``, large for a run at depth, e.g.
``CONDMSG_FUZZ_EXAMPLES=5000 pytest tests/fuzz``. Unit properties run that many examples;
the integration properties run a quarter as many *batches* (each batch is many inputs
against one running service: starting a service per example would cost seconds each).

The profiles have no deadline: on two busy cores a single example can take a second
without anything being wrong, and a deadline would turn that into a flaky failure.
"""

from __future__ import annotations

import os

from hypothesis import HealthCheck, Phase, settings

# The integration fixtures (one broker connection per worker, receivers closed after the
# test), shared with tests/integration.
from tests.integration.conftest import (  # noqa: F401
    amqp_connection,
    channel,
    make_receiver,
    test_secret,
)

DEFAULT_EXAMPLES = 50
EXAMPLES = max(1, int(os.environ.get("CONDMSG_FUZZ_EXAMPLES", str(DEFAULT_EXAMPLES))))
#: Batches of an integration property: each one holds many inputs.
BATCHES = max(3, EXAMPLES // 4)

settings.register_profile(
    "condmsg-fuzz-unit",
    max_examples=EXAMPLES,
    deadline=None,
    suppress_health_check=[HealthCheck.too_slow, HealthCheck.data_too_large],
)
settings.register_profile(
    "condmsg-fuzz-integration",
    max_examples=BATCHES,
    deadline=None,
    # A fixture (the running service) is shared by every example on purpose.
    suppress_health_check=[
        HealthCheck.too_slow,
        HealthCheck.data_too_large,
        HealthCheck.function_scoped_fixture,
    ],
    # Shrinking replays batches against a live service for minutes; a failing batch is
    # reported as generated, with its inputs in the assertion message.
    phases=[Phase.explicit, Phase.reuse, Phase.generate],
    report_multiple_bugs=False,
)

#: For ``@UNIT`` / ``@INTEGRATION`` on a ``@given`` test (the profiles are not loaded
#: globally: other suites in the same worker keep their own settings).
UNIT = settings.get_profile("condmsg-fuzz-unit")
INTEGRATION = settings.get_profile("condmsg-fuzz-integration")
#: For deep-nesting properties: their inputs are one depth each, nothing to shrink, and a
#: RecursionError makes every shrinking step slow (its traceback is thousands of frames).
DEEP = settings(UNIT, phases=[Phase.explicit, Phase.reuse, Phase.generate])
