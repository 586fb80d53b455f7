"""``make demo`` (``python -m condmsg.demo``): the paper's examples on the real services.

Application layer on top of the library, like :mod:`condmsg.cli`: it starts the evaluator
and receiver processes, so it may import every package (DESIGN section 4). The modules are
imported by ``__main__`` only, which keeps ``python -m condmsg.demo.rx`` (a receiver
process) from loading the rest.
"""
