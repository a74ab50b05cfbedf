"""Serving side: calibration model, load generation, vLLM and simulator replay backends."""
