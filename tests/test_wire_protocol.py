"""The control protocol against malformed and oversized messages (property tests on the wire format): the
orchestrator skips a worker's bad message and takes its next good one; the sidecar's and BubbleTea service's
server closes only the sender's connection; the data header and striping arithmetic round-trip."""

from __future__ import annotations

import json
import socket
import threading

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from testbed.emu.train import Controller, bad_message
from testbed.runtime.ctlserver import Client
from testbed.runtime.wire import (
    CTRL_LEN,
    DATA,
    ProtocolError,
    chunk_offset,
    chunk_sizes,
    recv_ctrl_skipping,
    send_ctrl,
)

LIMIT = 256  # a small frame limit, so oversized frames stay cheap to generate
scalars = st.one_of(st.none(), st.booleans(), st.integers(-2**31, 2**31), st.floats(allow_nan=False),
                    st.text(max_size=8))
# a good object fits the frame limit once encoded (escaped non-ASCII text can take 12 bytes a character)
objects = st.dictionaries(st.text(max_size=6), scalars, max_size=4).filter(
    lambda o: len(json.dumps(o, separators=(",", ":")).encode()) <= LIMIT)
bad_bodies = st.one_of(
    st.binary(max_size=40).filter(lambda b: not _is_object(b)),  # not JSON, or JSON but not an object
    st.sampled_from([b"[1, 2]", b"3", b'"x"', b"null", b"{", b"\xff\xfe", b"[" * 5000,
                     b"[" * 100_000 + b"]" * 100_000]),  # nesting deeper than the parser recurses: RecursionError
)


def _is_object(b: bytes) -> bool:
    try:
        return isinstance(json.loads(b), dict)
    except (ValueError, RecursionError):
        return False


def frame(body: bytes) -> bytes:
    return CTRL_LEN.pack(len(body)) + body


def good(obj: dict) -> bytes:
    return frame(json.dumps(obj, separators=(",", ":")).encode())


# a stream: good objects, malformed frames and oversized frames (their bytes sent in full), in any order
stream_items = st.lists(st.one_of(objects.map(lambda o: ("good", o)), bad_bodies.map(lambda b: ("bad", b)),
                                  st.integers(LIMIT + 1, 4 * LIMIT).map(lambda n: ("big", n))), max_size=8)


def _wire(items) -> bytes:
    out = b""
    for kind, x in items:
        out += good(x) if kind == "good" else frame(x) if kind == "bad" else CTRL_LEN.pack(x) + b"z" * x
    return out


@settings(max_examples=60, deadline=None)
@given(stream_items)
def test_a_reader_that_skips_takes_every_good_frame_in_order_and_rejects_each_bad_one(items):
    a, b = socket.socketpair()
    data = _wire(items) + good({"end": True})
    threading.Thread(target=a.sendall, args=(data,), daemon=True).start()
    rejected: list[str] = []
    got = []
    b.settimeout(5)
    while True:
        msg = recv_ctrl_skipping(b, rejected.append, LIMIT)
        if msg == {"end": True}:
            break
        got.append(msg)
    a.close()
    b.close()
    assert got == [x for kind, x in items if kind == "good" and x != {"end": True}]
    assert len(rejected) == sum(1 for kind, _ in items if kind != "good")


@settings(max_examples=60, deadline=None)
@given(st.lists(objects, max_size=5), st.data())
def test_the_server_frames_any_split_of_the_byte_stream(objs, data):
    wire = b"".join(good(o) for o in objs)
    cuts = sorted(data.draw(st.lists(st.integers(0, len(wire)), max_size=6)))
    c = Client(None)  # type: ignore[arg-type]  (frames() reads only the buffer)
    got = []
    for lo, hi in zip([0, *cuts], [*cuts, len(wire)], strict=True):
        c.buf += wire[lo:hi]
        got += list(c.frames())
    assert got == objs and not c.buf


@settings(max_examples=40, deadline=None)
@given(bad_bodies)
def test_the_server_raises_a_protocol_error_on_a_malformed_frame(body):
    c = Client(None)  # type: ignore[arg-type]
    c.buf += frame(body)
    with pytest.raises(ProtocolError):
        list(c.frames())


def test_the_server_refuses_an_oversized_frame_before_reading_it():
    c = Client(None)  # type: ignore[arg-type]
    c.buf += CTRL_LEN.pack(2**32 - 1)
    with pytest.raises(ProtocolError, match="bytes"):
        list(c.frames())


@given(st.integers(0, 2**40), st.integers(1, 64))
def test_stripes_cover_the_message_exactly(total, n):
    sizes = chunk_sizes(total, n)
    assert sum(sizes) == total and max(sizes) - min(sizes) <= 1
    assert [chunk_offset(total, n, i) for i in range(n)] == [sum(sizes[:i]) for i in range(n)]


@given(st.sampled_from([b"a", b"g", b"r"]), st.integers(0, 2**32 - 1), st.integers(0, 2**32 - 1),
       st.integers(0, 2**16 - 1), st.integers(1, 2**16 - 1), st.integers(0, 2**64 - 1), st.floats(0, 1e9))
def test_the_data_header_round_trips(kind, it, mb, chunk, chunks, n, t):
    assert DATA.unpack(DATA.pack(kind, it, mb, chunk, chunks, n, n, t)) == (kind, it, mb, chunk, chunks, n, n, t)


def _controller(tmp_path, n: int = 1) -> tuple[Controller, list[socket.socket]]:
    """A Controller whose workers are the far ends of socket pairs (expect() reads only its connections)."""
    ctl = Controller(str(tmp_path / "ctl.sock"), n)
    ends = []
    for k in range(n):
        a, b = socket.socketpair()
        ctl.conns[(k, 0)] = a
        ends.append(b)
    return ctl, ends


def test_the_orchestrator_rejects_a_workers_bad_messages_without_stopping_the_run(tmp_path):
    ctl, (w,) = _controller(tmp_path)
    try:
        def worker() -> None:  # a 17 MiB frame: more than the socket holds, so from a thread of its own
            w.sendall(frame(b"{not json") + CTRL_LEN.pack(17 * 2**20) + b"\0" * (17 * 2**20)
                      + good({"done": 0, "log": "nonsense"}) + good({"hello": 1}))
            send_ctrl(w, {"done": 0, "log": [["fwd", 0, 1.0, 2.0, 0]], "degraded": "", "waits": [1, 0.0, 0.0, 0.0]})

        threading.Thread(target=worker, daemon=True).start()
        out = ctl.expect("done", [], timeout=10)
        assert out[(0, 0)]["log"] == [["fwd", 0, 1.0, 2.0, 0]]
        assert len(ctl.rejected) == 4
        assert any("not JSON" in r for r in ctl.rejected) and any("exceeds" in r for r in ctl.rejected)
    finally:
        ctl.close()


def test_a_worker_that_never_sends_a_good_message_ends_the_run_with_one_line(tmp_path):
    from testbed.emu.sh import EmuError

    ctl, (w,) = _controller(tmp_path)
    try:
        w.sendall(frame(b"[]"))
        with pytest.raises(EmuError, match=r"worker s0r0: no 'done' within 0.5 s"):
            ctl.expect("done", [], timeout=0.5)
        assert len(ctl.rejected) == 1
    finally:
        ctl.close()


@pytest.mark.parametrize("msg,why", [
    ({"ready": [0, 0]}, "expected 'done'"),
    ({"done": 0, "log": [["fwd", 0, 1.0]]}, "log"),
    ({"done": 0, "log": [], "waits": [1, 2]}, "waits"),
    ({"done": 0, "log": [], "degraded": 3}, "degraded"),
    ({"done": 0, "log": [], "loss": "x"}, "loss"),
])
def test_a_done_message_of_the_wrong_shape_is_named(msg, why):
    assert why in bad_message("done", msg)
    assert bad_message("done", {"done": 0, "log": [["send", 1, 0.5, 0.7, 1024.0]], "loss": None}) == ""
