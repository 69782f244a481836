"""The gateway: Mosaic's HTTP front door (submit, cancel, list, dashboard).

It owns ``jobs.submit`` and ``jobs.cancel`` and nothing else; everything it shows comes from a
read model rebuilt from the LIFECYCLE stream and the ``nodes``/``ledger`` KV buckets.
"""
