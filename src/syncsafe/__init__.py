"""syncsafe: policy-gated DiLoCo merges on a fleet shared with LLM serving.

The library behind the pipeline: trace generation, merge policies and the
trace-time controller, merge schedules, training, serving replay and the
evidence protocol. Stages (`stages/`) and DAGs (`dags/`) are thin callers.
"""

__version__ = "0.1.0"
