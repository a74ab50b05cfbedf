"""What a test that owns an MLflow store clears first: the environment that switches or redirects tracking."""

TRACKING_ENV = ("MLFLOW_TRACKING_URI", "SYNCSAFE_TRACKING", "SYNCSAFE_TRACKING_STRICT", "SYNCSAFE_EXPERIMENT",
                "SYNCSAFE_PIPELINE_RUN_ID", "DVC_STAGE", "MLFLOW_ENABLE_SYSTEM_METRICS_LOGGING")
