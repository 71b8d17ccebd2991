"""Metrics from timelines; simulator-vs-emulator validation."""
