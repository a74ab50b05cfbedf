"""The host name an Airflow worker of the team setup records in its task instances.

Both Celery workers run on one machine, so the machine's name alone would not
tell them apart. Airflow calls ``[core] hostname_callable`` (set to
``syncsafe.team.hostname.worker_hostname`` on the workers) when a task starts
and stores the result as the task instance's ``hostname``: ``<worker>@<host>``,
the worker being ``SYNCSAFE_TEAM_WORKER`` (``cpu`` or ``gpu``).

Standard library only: it is imported by Airflow in ``.venv-airflow``.
"""

from __future__ import annotations

import os
import socket

WORKER_ENV = "SYNCSAFE_TEAM_WORKER"


def worker_hostname() -> str:
    """``<worker>@<host>``, or the plain host name outside a team worker."""
    host = socket.gethostname()
    worker = os.environ.get(WORKER_ENV, "").strip()
    return f"{worker}@{host}" if worker else host
