"""Geo-distributed training testbed: Atlas and BubbleTea, simulated and emulated.

Data flows one way: spec -> plan -> (simulate | emulate) -> timeline -> metrics/CSV -> figures.
"""

__version__ = "0.1.0"
