"""``python -m evaluator --sender NAME``: the same as ``condmsg evaluator``."""

import argparse
import sys

from condmsg.errors import CondmsgError
from evaluator.cli import HELP, add_arguments, run

parser = argparse.ArgumentParser(prog="python -m evaluator", description=HELP)
add_arguments(parser)
args = parser.parse_args()
try:
    sys.exit(run(args))
except CondmsgError as exc:
    print(f"evaluator: {exc}", file=sys.stderr)
    sys.exit(2)
except KeyboardInterrupt:
    sys.exit(130)
