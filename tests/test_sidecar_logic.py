from testbed.runtime.sidecar import IDLE_PRIO, priorities
from testbed.runtime.wire import ProtocolError, recv_ctrl


def test_turns_go_to_the_earliest_microbatch_then_the_turn_order():
    # (microbatch, turn position, replica)
    assert priorities([(3, 1, 1), (2, 0, 0), (2, 2, 2)]) == {0: 0, 2: 1, 1: 2}
    assert priorities([(5, 0, 0), (1, 3, 3), (4, 0, 0)]) == {3: 0, 0: 1}  # a replica ranks by its earliest
    many = priorities([(i, i, i) for i in range(12)])
    assert many[0] == 0 and many[11] == IDLE_PRIO
    assert priorities([]) == {}


def test_control_frames_are_bounded_and_must_be_json_objects():
    import socket
    import struct

    import pytest

    for bad in (struct.pack("!I", 2**30), struct.pack("!I", 3) + b"abc", struct.pack("!I", 2) + b"[]"):
        a, b = socket.socketpair()
        a.sendall(bad)
        with pytest.raises(ProtocolError):
            recv_ctrl(b)
        a.close()
        b.close()
