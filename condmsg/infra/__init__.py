"""The shared infrastructure: the tools under the outbox and every service alike.

The outbox, the sender, the receiver and the evaluator all retry with one backoff
(:mod:`~condmsg.infra.backoff`), log a failing operation once per change of state
(:mod:`~condmsg.infra.repeated_failures`), print URLs without their credentials
(:mod:`~condmsg.infra.urls`), choose each store's adapter from its engine
(:mod:`~condmsg.infra.backends`), carry the trace context in their messages
(:mod:`~condmsg.infra.tracing`), and gate the paths that go beneath pika's and psycopg's
public API (:mod:`condmsg.infra.fastpaths`).

This layer imports only :mod:`condmsg.core` and third-party libraries, so every layer
above may use it, the outbox included (docs/layout.md). Nothing is imported here: a
process that needs one of these modules imports it by name, and ``import condmsg`` loads
none of them.
"""
