"""What every condmsg process runs on: settings, database and broker connections, queue
topology, migrations, logging, the ops endpoint, stopping and pausing."""
