"""The real arm: the vLLM server profiled, the plan checked, the replays taken and judged."""
