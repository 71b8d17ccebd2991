"""Processes that run inside emulated hosts: pipeline workers (and later the Atlas sidecar and the
BubbleTea service). They execute a plan they are given; they never decide one."""
