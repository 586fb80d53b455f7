"""Alembic's environment for condmsg: always handed a connection by
:mod:`condmsg.runtime.migrate`."""

from __future__ import annotations

from alembic import context

from condmsg.runtime.migrate import VERSION_TABLE


def run() -> None:
    connection = context.config.attributes["connection"]
    context.configure(
        connection=connection,
        version_table=VERSION_TABLE,
        # SQLite alters a table by copying it: Alembic's batch mode does that where needed.
        render_as_batch=connection.dialect.name == "sqlite",
        transaction_per_migration=True,
    )
    with context.begin_transaction():
        context.run_migrations()


# Alembic runs this file as a script, with its context set up; imported any other way (a
# test walking the package), it does nothing.
if hasattr(context, "config"):
    run()
