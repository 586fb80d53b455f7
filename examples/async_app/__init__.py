"""A small Starlette app that sends a conditional message per request (docs/async.md)."""
