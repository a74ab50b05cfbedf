"""Serving workloads: seeded load timelines, request lists and public-trace importers."""
