"""The live sidecar: a controller deciding merges of real islands against a real vLLM server."""
