"""Planning: placement, schedules and the WAN plan. Never touches the network."""

from testbed.plan.build import build_plan
from testbed.plan.mechanisms import Mechanisms, parse_scheduler
from testbed.plan.plan import IntraDC, LinkPlan, Plan
from testbed.plan.schedules import Action, build_schedule

__all__ = ["Action", "IntraDC", "LinkPlan", "Mechanisms", "Plan", "build_plan", "build_schedule", "parse_scheduler"]
