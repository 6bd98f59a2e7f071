"""The life of a training job.

::

    queued ──claim──▶ running ──▶ succeeded   (a model exists, model_id set)
      ▲                  │    └──▶ failed      (error says why)
      └──lease expired───┘
    queued / running ──DELETE──▶ cancelled

A running job holds a *lease* that its worker renews with each heartbeat. When a
worker dies the lease expires and the next claim takes the job again (attempts
+ 1); training resumes from the job's last epoch checkpoint. A worker that finds
its job no longer ``running`` under its own id (cancelled, or re-claimed after it
stalled) stops and writes nothing.
"""

from __future__ import annotations

from enum import StrEnum


class Status(StrEnum):
    QUEUED = "queued"
    """Waiting for a worker (new, or taken back after its worker's lease expired)."""
    RUNNING = "running"
    """A worker holds the lease and is training."""
    SUCCEEDED = "succeeded"
    """Finished; ``model_id`` names the model. Final."""
    FAILED = "failed"
    """Stopped by an error in the job itself (``error``). Final."""
    CANCELLED = "cancelled"
    """Cancelled through ``DELETE /v1/jobs/{id}``. Final."""

    @property
    def is_final(self) -> bool:
        return self in {Status.SUCCEEDED, Status.FAILED, Status.CANCELLED}
