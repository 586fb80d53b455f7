"""Subcommands of the ``condmsg`` CLI; each module exposes ``register(subparsers)``."""
