"""The pure core: conditions and their codec, evaluation, the wire protocol, acks, outcomes,
the error root and time.

It imports nothing outside this subpackage: no I/O library and no other part of condmsg.
"""
