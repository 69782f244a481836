"""The scorer: each pending attempt's admission score, and the queue's metrics.

It owns two facts: the admission ``Queued`` lifecycle event (one per attempt, the job's score as
of its queueing, in the ``scorer.score`` span of the job's trace) and the ``mosaic_scorer_*``
gauges (queue length, load, regime). The queue's order is the placer's: it is decided where
placement happens, at each pass's moment and in its state (``services.scorer.service``).
"""
