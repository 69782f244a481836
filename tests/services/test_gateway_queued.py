"""The gateway's read model with two publishers of ``Queued`` (issue 13): the scorer's admission
score (no reason) and the placer's reason to wait (with the current score), in either order; a
``Queued`` that arrives after the placement; the two at the same time."""

from __future__ import annotations

from proto.events import Placed, Preempted, Queued, Started, Submitted
from proto.jobs import JobSpec
from proto.views import JobView
from services.gateway.jobs_view import JobsModel


def _model(job: str = "q-1") -> tuple[JobsModel, JobView]:
    m = JobsModel()
    m.apply(Submitted(job_id=job, time=1.0, spec=JobSpec(id=job, submit_time=1.0)))
    view = m.get(job)
    assert view is not None
    return m, view


def test_the_scorers_queued_keeps_the_placers_reason() -> None:
    m, job = _model()
    m.apply(Queued(job_id="q-1", time=2.0, reason="Resources", score=0.4))
    m.apply(Queued(job_id="q-1", time=2.5, score=0.3, attempt=1))  # admission, late
    assert (job.state, job.reason, job.score) == ("pending", "Resources", 0.3)


def test_a_queued_without_a_score_keeps_the_score() -> None:
    m, job = _model()
    m.apply(Queued(job_id="q-1", time=2.0, score=0.3, attempt=1))  # admission first
    assert (job.state, job.reason, job.score) == ("pending", "", 0.3)
    m.apply(Queued(job_id="q-1", time=3.0, reason="Priority"))
    assert (job.reason, job.score) == ("Priority", 0.3)
    m.apply(Queued(job_id="q-1", time=4.0, reason="Resources", score=0.5))
    assert (job.reason, job.score) == ("Resources", 0.5)


def test_a_queued_after_the_placement_does_not_make_the_job_pending() -> None:
    m, job = _model()
    m.apply(Placed(job_id="q-1", time=2.0, node="a", attempt=1))
    m.apply(Queued(job_id="q-1", time=2.1, score=0.3, attempt=1))  # the scorer was slower
    m.apply(Queued(job_id="q-1", time=2.2, reason="Resources", score=0.3))
    assert (job.state, job.node, job.reason) == ("placed", "a", "")
    m.apply(Started(job_id="q-1", time=3.0, node="a", attempt=1))
    m.apply(Queued(job_id="q-1", time=3.1, reason="Resources"))
    assert (job.state, job.reason) == ("running", "")
    # preempted: pending again, and the next attempt's news counts
    m.apply(Preempted(job_id="q-1", time=4.0, node="a", reason="defrag", attempt=1))
    m.apply(Queued(job_id="q-1", time=4.1, score=0.9, attempt=2))
    assert (job.state, job.reason, job.score) == ("pending", "defrag", 0.9)
    m.apply(Queued(job_id="q-1", time=5.0, reason="Resources"))
    assert (job.state, job.reason) == ("pending", "Resources")


def test_queued_events_at_the_same_time_are_distinct_events() -> None:
    """A stepped clock gives the scorer and the placer, or two of the placer's reasons, the
    same time: none is a repeat of another, but a redelivery is."""
    m, job = _model()
    assert m.apply(Queued(job_id="q-1", time=2.0, score=0.3, attempt=1))
    assert m.apply(Queued(job_id="q-1", time=2.0, reason="Priority", score=0.3))
    assert m.apply(Queued(job_id="q-1", time=2.0, reason="Resources", score=0.3))
    assert not m.apply(Queued(job_id="q-1", time=2.0, reason="Resources", score=0.3))
    assert job.reason == "Resources" and len(m.events("q-1")) == 4
