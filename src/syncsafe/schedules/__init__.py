"""Merge schedules: the contract, overlap measures, and derived schedules."""
