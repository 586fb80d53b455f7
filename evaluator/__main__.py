"""``python -m evaluator --sender NAME``: the same as ``condmsg evaluator``."""

import argparse
import sys

from condmsg.core.errors import CondmsgError
from condmsg.runtime.exit_codes import INTERRUPTED, USAGE, HelpFormatter, epilog
from evaluator.cli import DESCRIPTION, add_arguments, run

parser = argparse.ArgumentParser(
    prog="python -m evaluator",
    description=DESCRIPTION,
    epilog=epilog("evaluator"),
    formatter_class=HelpFormatter,
)
add_arguments(parser)
args = parser.parse_args()
try:
    sys.exit(run(args))
except CondmsgError as exc:
    print(f"evaluator: {exc}", file=sys.stderr)
    sys.exit(USAGE)
except KeyboardInterrupt:
    sys.exit(INTERRUPTED)
