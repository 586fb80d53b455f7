"""The sender side: :class:`~condmsg.sending.sender.Sender`, the copies of a CM, the rows
a send writes and the outcome notifications it reads."""
