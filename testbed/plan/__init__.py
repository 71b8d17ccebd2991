"""Planning: placement, schedules and the WAN plan. Never touches the network.

Nothing is imported here: role processes (the Atlas sidecar, workers) import the stdlib-only modules of
this package (turns, schedules) in images without pydantic; build_fixed is in testbed.plan.build; build_plan, which
simulates Atlas's candidates to choose its mechanisms, in testbed.sim.choose.
"""
