"""Example applications built on condmsg (docs/async.md)."""
