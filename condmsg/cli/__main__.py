"""``python -m condmsg.cli``: the same as the ``condmsg`` command."""

import sys

from condmsg.cli import main

sys.exit(main())
