"""The job-producer SDK (``MosaicClient``) and the ``mosaic`` command line.

``api`` talks to the gateway; ``producer`` submits and cancels jobs over the bus (NATS user
``producer``); ``cli`` is the command line; ``supervisor`` runs the local stack
behind ``mosaic up`` (and the end-to-end tests); ``demo`` generates a demo workload.
"""
