"""Merge control: learner reports, fleet signals, forecasters, policies and the controller loop."""
