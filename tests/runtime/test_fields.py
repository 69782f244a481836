"""The checkpoint fields of a job (issue 14): sound defaults, and every refusal names the field."""

from __future__ import annotations

import math

import pytest

from proto.commands import CheckpointCommand
from proto.jobs import JobSpec
from proto.validation import (
    CHECKPOINT_SIGNALS,
    JobRejected,
    decode_job,
    revalidate_checkpoint_command,
    revalidate_spec,
    validate_job,
)


def fields(spec: JobSpec) -> dict[str, str]:
    return {e.field: e.reason for e in revalidate_spec(spec)}


def test_defaults_are_sound_and_every_listed_signal_is_accepted() -> None:
    spec = JobSpec(id="j")
    assert (spec.checkpoint_signal, spec.checkpoint_grace_s) == ("SIGUSR1", 30.0)
    assert validate_job(spec, now=0.0) == []
    for name in CHECKPOINT_SIGNALS:
        assert fields(JobSpec(id="j", checkpoint_signal=name)) == {}
    assert fields(JobSpec(id="j", checkpoint_grace_s=3600.0)) == {}


@pytest.mark.parametrize("name", ["SIGKILL", "SIGSTOP", "SIGSEGV", "USR1", "", "SIGUSR1 "])
def test_a_signal_that_is_no_checkpoint_signal_is_refused(name: str) -> None:
    reason = fields(JobSpec(id="j", checkpoint_signal=name))["checkpoint_signal"]
    assert "must be one of SIGUSR1" in reason and repr(name) in reason


@pytest.mark.parametrize("grace_s", [0.0, -1.0, 3600.5, math.inf, math.nan])
def test_a_grace_outside_0_3600_is_refused(grace_s: float) -> None:
    assert set(fields(JobSpec(id="j", checkpoint_grace_s=grace_s))) == {"checkpoint_grace_s"}


def test_over_http_a_wrong_type_names_the_field() -> None:
    with pytest.raises(JobRejected) as exc:
        decode_job(b'{"id": "j", "checkpoint_grace_s": "30"}')
    assert [e.field for e in exc.value.errors] == ["checkpoint_grace_s"]
    with pytest.raises(JobRejected) as exc:
        decode_job(b'{"id": "j", "checkpoint_signal": 10}')
    assert [e.field for e in exc.value.errors] == ["checkpoint_signal"]


def test_checkpoint_commands_are_checked_field_by_field() -> None:
    assert revalidate_checkpoint_command(CheckpointCommand(job_id="j", reason="r")) == []
    ok = CheckpointCommand(job_id="j", reason="r", attempt=2, cost_s=0.0)
    assert revalidate_checkpoint_command(ok) == []
    bad = CheckpointCommand(job_id="../x", reason="r", attempt=0, cost_s=math.nan)
    assert [e.field for e in revalidate_checkpoint_command(bad)] == ["job_id", "attempt", "cost_s"]
    too_long = CheckpointCommand(job_id="j", reason="r", cost_s=1e9)
    assert [e.field for e in revalidate_checkpoint_command(too_long)] == ["cost_s"]
