"""Unit conversions, one place for all of them: rates (Gbit/s, Mbit/s, bits/s, bytes/s), times (ms, s) and sizes
(MiB, KiB, bytes). Each name says what it takes and what it gives; each works on floats and on arrays alike.
Gigabits and megabits are decimal (1e9, 1e6 bits), mebibytes and kibibytes binary (2**20, 2**10 bytes), as Linux
and tc count them."""

from __future__ import annotations

from typing import TypeVar

X = TypeVar("X")  # a float, or an array or series of them
BITS_PER_BYTE = 8
MIB_BYTES = 2**20
KIB_BYTES = 2**10


def gbps_to_bytes_s(gbps: X) -> X:
    return gbps * 1e9 / BITS_PER_BYTE  # type: ignore[operator]


def bytes_s_to_gbps(bytes_s: X) -> X:
    return bytes_s * BITS_PER_BYTE / 1e9  # type: ignore[operator]


def gbps_to_bps(gbps: X) -> X:
    return gbps * 1e9  # type: ignore[operator]


def gbps_to_mbps(gbps: X) -> X:
    return gbps * 1e3  # type: ignore[operator]


def mbps_to_bytes_s(mbps: X) -> X:
    return mbps * 1e6 / BITS_PER_BYTE  # type: ignore[operator]


def bytes_s_to_mbps(bytes_s: X) -> X:
    return bytes_s * BITS_PER_BYTE / 1e6  # type: ignore[operator]


def bps_to_bytes_s(bps: X) -> X:
    return bps / BITS_PER_BYTE  # type: ignore[operator]


def bytes_s_to_bps(bytes_s: X) -> X:
    return bytes_s * BITS_PER_BYTE  # type: ignore[operator]


def bps_to_gbps(bps: X) -> X:
    return bps / 1e9  # type: ignore[operator]


def ms_to_s(ms: X) -> X:
    return ms / 1e3  # type: ignore[operator]


def s_to_ms(s: X) -> X:
    return s * 1e3  # type: ignore[operator]


def mib_to_bytes(mib: X) -> X:
    return mib * MIB_BYTES  # type: ignore[operator]


def bytes_to_kib(nbytes: X) -> X:
    return nbytes / KIB_BYTES  # type: ignore[operator]
