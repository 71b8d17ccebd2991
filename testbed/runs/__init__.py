"""Runs that combine planning and simulation: the planner's search over DC sets and layouts
(`select.py`), which simulates its candidates. `plan/` itself never imports the simulator."""
