"""``python -m evaluator --sender NAME``: the same as ``condmsg evaluator``."""

import sys

from condmsg.cli import main

sys.exit(main(["evaluator", *sys.argv[1:]]))
