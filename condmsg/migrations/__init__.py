"""Alembic migrations of condmsg's stores; run them with ``condmsg db upgrade`` or
:func:`condmsg.runtime.migrate.upgrade` (see ``docs/operations.md``)."""
