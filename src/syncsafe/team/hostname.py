"""The host name an Airflow worker of the team setup records in its task instances.

On one machine both Celery workers share the machine's name, so that name
alone would not tell them apart; on a fleet of test hosts (network namespaces
of one machine) the machine's name is the same on every host. Airflow calls
``[core] hostname_callable`` (set to
``syncsafe.team.hostname.worker_hostname`` on the workers) when a task starts
and stores the result as the task instance's ``hostname``: ``<worker>@<host>``,
the worker being ``SYNCSAFE_TEAM_WORKER`` (``cpu`` or ``gpu``) and the host
``SYNCSAFE_HOST`` where set (a fleet host: ``gpu@b``), else the machine's name.

Standard library only: it is imported by Airflow in ``.venv-airflow``.
"""

from __future__ import annotations

import os
import socket

WORKER_ENV = "SYNCSAFE_TEAM_WORKER"
#: The fleet host a process runs on; the same name as ``syncsafe.procs.HOST_ENV`` (not imported from
#: there: that module needs the pipeline's environment).
HOST_ENV = "SYNCSAFE_HOST"


def worker_hostname() -> str:
    """``<worker>@<host>``, or the plain host name outside a team worker."""
    host = os.environ.get(HOST_ENV, "").strip() or socket.gethostname()
    worker = os.environ.get(WORKER_ENV, "").strip()
    return f"{worker}@{host}" if worker else host
