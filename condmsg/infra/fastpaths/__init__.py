"""The code that leans on pika's and psycopg's internals, behind one gate.

Where a library's public API costs too much on a hot path, condmsg goes beneath it, and
such code is right only for the releases it was tested with. Every such path is chosen at
run time by :mod:`~condmsg.infra.fastpaths.gate` (a tested release with the internals
there, else the plain path; ``auto``, ``fast`` or ``plain`` forced by a setting):

- :mod:`~condmsg.infra.fastpaths.pg`: batches sent to PostgreSQL as one statement with
  binary array parameters, on psycopg's connection under a SQLAlchemy session (the
  psycopg store adapters of the outbox, the sender and the evaluator);
- :mod:`outbox.publish_frames`: the relay's ``basic.publish`` frames, written through
  pika's private write hook;
- :mod:`ackd.fastpath`: the receiver's RLOG claim and COMMIT ack, sent through psycopg's
  libpq layer.

The last two encode the outbox's and the receiver's own rows and frames, so they stay
beside them; what they take from the libraries is gated here.
"""
