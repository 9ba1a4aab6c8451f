"""Bridges to the tools users already train and log with (TRL, trackers)."""
