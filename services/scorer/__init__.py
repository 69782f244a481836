"""The scorer: keeps the set of pending jobs and publishes them ranked, best first.

It owns one fact, the ranked queue (KV ``queue``/``ranked``), rebuilt from the LIFECYCLE stream
at every start; the ranking itself is ``libs.policy.priority.rank``.
"""
