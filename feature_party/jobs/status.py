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

The statuses are the shared queue's (:mod:`shared.lease_queue`): the labels
party's trainings use the same ones.
"""

from __future__ import annotations

from shared.lease_queue import Status

__all__ = ["Status"]
