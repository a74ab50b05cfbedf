"""The environment a stage process gets when an orchestrator starts it: an allow-list, never the orchestrator's secrets.

An Airflow worker's environment holds the metadata database's URL and
password, the Fernet key, the JWT and API signing secrets and the broker URL
with Redis's password. A DAG task that started a stage with that environment
would hand all of them to DVC, the islands, the vLLM server and anything a
run's overrides point `replay.vllm.python` at. So every stage command of the
DAGs (`dags/syncsafe_dag_support.py`) starts through this launcher:

    python -m syncsafe.stage_env -- PROGRAM [ARG ...]

which replaces itself (`execvpe`) with PROGRAM under `stage_environment()`
of its own environment: the names a stage needs (the tracking URI and the
stage's own MLflow credentials, the project's `SYNCSAFE_*` settings, DVC's,
git's, the accelerator's and the thread libraries', locale and the basics a
process expects) and nothing else. Proxies are not handed on: a stage talks
only to the project's own services (loopback or fleet addresses), which a
proxy would intercept, and never needs the network beyond them. A name that says it holds a
secret (`*PASSWORD*`, `*SECRET*`, `*FERNET*`, ...) is dropped even under an
allowed prefix, unless it is one of the stage's own credentials named in
`OWN_CREDENTIALS`. Because it is an exec, `/proc/<pid>/environ` of the running
stage is the filtered environment, not the worker's.
"""

from __future__ import annotations

import os
import re
import sys
from collections.abc import Mapping, Sequence

#: Names a stage process may inherit as they are.
ALLOWED_NAMES = frozenset({
    "PATH", "HOME", "USER", "LOGNAME", "SHELL", "PWD", "HOSTNAME", "LANG", "LANGUAGE", "TZ", "TERM",
    "TMPDIR", "TMP", "TEMP", "VIRTUAL_ENV", "LD_LIBRARY_PATH", "LD_PRELOAD",
    "SSL_CERT_FILE", "SSL_CERT_DIR", "REQUESTS_CA_BUNDLE",
    "MLFLOW_TRACKING_URI", "MLFLOW_EXPERIMENT_NAME", "MLFLOW_ENABLE_SYSTEM_METRICS_LOGGING",
})  # fmt: skip
#: Prefixes of the names a stage may inherit: the project's settings, DVC, git (a study commits experiments),
#: locale, Python, the hub cache, torch and its thread libraries, the accelerator, vLLM.
ALLOWED_PREFIXES = ("SYNCSAFE_", "DVC_", "GIT_", "LC_", "PYTHON", "HF_", "TRANSFORMERS_", "TORCH", "OMP_", "MKL_",
                    "KMP_", "OPENBLAS_", "CUDA_", "NVIDIA_", "NCCL_", "GLOO_", "VLLM_")
#: The stage's own credentials: for the MLflow server it logs to and the model hub it reads from.
OWN_CREDENTIALS = frozenset({"MLFLOW_TRACKING_USERNAME", "MLFLOW_TRACKING_PASSWORD", "MLFLOW_TRACKING_TOKEN",
                             "HF_TOKEN"})
#: A name that says it carries a secret is never passed under a prefix.
SECRET_NAME = re.compile(r"PASSWORD|PASSWD|SECRET|FERNET|TOKEN|CREDENTIAL|PRIVATE|_KEY$|^KEY_|BROKER", re.IGNORECASE)


def stage_environment(environ: Mapping[str, str]) -> dict[str, str]:
    """The allow-listed part of `environ` (see the module docstring)."""
    kept = {}
    for name, value in environ.items():
        if name in OWN_CREDENTIALS or name in ALLOWED_NAMES:
            kept[name] = value
        elif name.startswith(ALLOWED_PREFIXES) and not SECRET_NAME.search(name):
            kept[name] = value
    return kept


def main(argv: Sequence[str] | None = None) -> int:
    """`python -m syncsafe.stage_env -- PROGRAM [ARG ...]`: exec PROGRAM with the allow-listed environment."""
    args = list(sys.argv[1:] if argv is None else argv)
    if args[:1] == ["--"]:
        args = args[1:]
    if not args:
        print("usage: python -m syncsafe.stage_env -- PROGRAM [ARG ...]: no PROGRAM given", file=sys.stderr)
        return 2
    try:
        os.execvpe(args[0], args, stage_environment(os.environ))
    except OSError as err:
        print(f"syncsafe.stage_env: cannot start {args[0]!r}: {err.strerror}", file=sys.stderr)
        return 127


if __name__ == "__main__":
    raise SystemExit(main())
