"""Cluster spec (`cluster.yaml`): the machines an emulation spreads over, and which DC goes on which.

```yaml
ray_address: auto            # the Ray cluster to join (run testbed on one of its nodes); `auto`: the local one
machines:                    # optional: by default every alive Ray node, in order of address
  - {name: m0, address: 10.0.0.10}
  - {name: m1, address: 10.0.0.11}
placement: {useast: m0, uswest: m1}   # optional: DC -> machine; unplaced DCs go round-robin
tunnel: vxlan                # a WAN link between DCs on different machines
```
"""

from __future__ import annotations

import ipaddress
import re
from typing import Literal

from pydantic import BaseModel, ConfigDict, Field, field_validator, model_validator

MACHINE_NAME = re.compile(r"^[a-z][a-z0-9]{0,11}$")
VXLAN_PORT = 4789  # IANA's VXLAN port
MAX_VNI = 2**24 - 1


class Machine(BaseModel):
    model_config = ConfigDict(extra="forbid", frozen=True)
    name: str = Field(description="a short name (letters and digits), used in errors and logs")
    address: str = Field(description="the machine's address on the cluster network (its Ray node address)")

    @field_validator("name")
    @classmethod
    def _name(cls, v: str) -> str:
        if not MACHINE_NAME.match(v):
            raise ValueError(f"{v!r} is not a machine name: use a lowercase letter then up to 11 letters/digits")
        return v

    @field_validator("address")
    @classmethod
    def _address(cls, v: str) -> str:
        try:
            ipaddress.IPv4Address(v)
        except ValueError:
            raise ValueError(f"{v!r} is not an IPv4 address: give the machine's address on the cluster "
                             f"network") from None
        return v


class Cluster(BaseModel):
    model_config = ConfigDict(extra="forbid", frozen=True)
    ray_address: str = Field("auto", description="`auto` (the Ray cluster this machine is a node of) or host:port")
    machines: list[Machine] = Field(default_factory=list, description="empty: every alive Ray node")
    placement: dict[str, str] = Field(default_factory=dict, description="DC -> machine name")
    tunnel: Literal["vxlan", "gre"] = "vxlan"
    vxlan_port: int = Field(VXLAN_PORT, ge=1, le=65535)
    vni_base: int = Field(4200, ge=1, le=MAX_VNI - 250, description="link k's tunnel is VNI vni_base + k")

    @model_validator(mode="after")
    def _unique(self) -> Cluster:
        for attr in ("name", "address"):
            seen = [getattr(m, attr) for m in self.machines]
            dup = next((v for v in seen if seen.count(v) > 1), None)
            if dup is not None:
                raise ValueError(f"machines: {attr} {dup!r} appears twice; give each machine its own")
        names = {m.name for m in self.machines}
        for dc, m in self.placement.items():
            if names and m not in names:
                raise ValueError(f"placement.{dc}: no machine {m!r}; use one of {', '.join(sorted(names))}")
        return self
