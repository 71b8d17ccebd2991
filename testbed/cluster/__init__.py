"""Emulation across several machines: a cluster spec's DCs placed on machines (placement.py), each machine's
part built by a root Ray actor there (machine.py) with the single-machine builder, WAN links between machines
as VXLAN tunnels shaped at the sending end (part.py), driven from one node of the Ray cluster (driver.py)."""
