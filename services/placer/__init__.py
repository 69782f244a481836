"""The placer: the only writer of the allocation ledger (KV ``ledger``).

Active/standby: one replica holds the lease ``leases``/``placer`` and acts; the others follow the
lifecycle stream and wait. Every decision is ``libs.policy``; this package is the shell that reads
the cluster, commits allocations with create/compare-and-set and sends the commands.
"""
