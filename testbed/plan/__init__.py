"""Planning: placement, schedules and the WAN plan. Never touches the network.

Nothing is imported here: role processes (the Atlas sidecar, workers) import the stdlib-only modules of
this package (turns, schedules) in images without pydantic; import build_plan from testbed.plan.build.
"""
