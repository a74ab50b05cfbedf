"""The stage launcher's allow-list: what a stage inherits, what it never does, and its usage error."""

from __future__ import annotations

import subprocess
import sys

from syncsafe.stage_env import stage_environment


def test_the_stage_keeps_what_it_needs_and_loses_every_orchestrator_secret():
    worker = {
        "PATH": "/bin", "HOME": "/root", "LC_ALL": "C.UTF-8", "MLFLOW_TRACKING_URI": "http://127.0.0.1:5000",
        "MLFLOW_TRACKING_USERNAME": "stage", "MLFLOW_TRACKING_PASSWORD": "its-own", "HF_TOKEN": "hub",
        "SYNCSAFE_REPO": "/repo", "DVC_NO_ANALYTICS": "1", "GIT_AUTHOR_NAME": "ci", "OMP_NUM_THREADS": "1",
        "CUDA_VISIBLE_DEVICES": "0",
        # a proxy would intercept the stage's traffic to the project's own services
        "http_proxy": "http://proxy:3128", "HTTPS_PROXY": "http://proxy:3128", "no_proxy": "127.0.0.1",
        # the worker's: never the stage's
        "AIRFLOW__CORE__FERNET_KEY": "f", "AIRFLOW__DATABASE__SQL_ALCHEMY_CONN": "postgresql://a:pw@h/db",
        "AIRFLOW__CELERY__BROKER_URL": "redis://:pw@h/0", "AIRFLOW_HOME": "/af", "PGPASSWORD": "pw",
        "REDISCLI_AUTH": "pw", "AWS_SECRET_ACCESS_KEY": "s",
        # secret-looking names under an allowed prefix
        "SYNCSAFE_ADMIN_PASSWORD": "pw", "SYNCSAFE_API_KEY": "k", "SYNCSAFE_BROKER_URL": "redis://:pw@h/0",
        "DVC_STUDIO_TOKEN": "t", "GIT_PRIVATE_KEY": "k",
    }  # fmt: skip
    kept = stage_environment(worker)
    assert set(kept) == {"PATH", "HOME", "LC_ALL", "MLFLOW_TRACKING_URI", "MLFLOW_TRACKING_USERNAME",
                         "MLFLOW_TRACKING_PASSWORD", "HF_TOKEN", "SYNCSAFE_REPO", "DVC_NO_ANALYTICS",
                         "GIT_AUTHOR_NAME", "OMP_NUM_THREADS", "CUDA_VISIBLE_DEVICES"}
    assert all(kept[k] == worker[k] for k in kept)


def test_the_launcher_execs_its_program_with_the_filtered_environment_or_names_what_is_missing():
    env = {"PATH": "/usr/bin:/bin", "SYNCSAFE_X": "1", "AIRFLOW__CORE__FERNET_KEY": "f"}
    code = "import os; print(sorted(k for k in os.environ if k in ('SYNCSAFE_X', 'AIRFLOW__CORE__FERNET_KEY')))"
    done = subprocess.run([sys.executable, "-m", "syncsafe.stage_env", "--", sys.executable, "-c", code],
                          capture_output=True, text=True, env=env, check=True)
    assert done.stdout.strip() == "['SYNCSAFE_X']"
    usage = subprocess.run([sys.executable, "-m", "syncsafe.stage_env", "--"], capture_output=True, text=True, env=env)
    assert usage.returncode == 2 and "no PROGRAM given" in usage.stderr and len(usage.stderr.splitlines()) == 1
    missing = subprocess.run([sys.executable, "-m", "syncsafe.stage_env", "--", "/no/such/program"],
                             capture_output=True, text=True, env=env)
    assert missing.returncode == 127 and "cannot start '/no/such/program'" in missing.stderr
