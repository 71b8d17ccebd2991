"""Specs users write in YAML: topology, workload, experiment."""

from testbed.spec.experiment import BubbleTeaOptions, Experiment, NetworkOptions
from testbed.spec.load import load_experiment, load_topology
from testbed.spec.topology import DC, Topology, WanLink
from testbed.spec.workload import CustomModel, Workload

__all__ = [
    "DC",
    "BubbleTeaOptions",
    "CustomModel",
    "Experiment",
    "NetworkOptions",
    "Topology",
    "WanLink",
    "Workload",
    "load_experiment",
    "load_topology",
]
