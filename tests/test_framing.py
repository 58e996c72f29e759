"""One length-prefixed codec and one frame reader (simipu.framing) under the rendezvous, the agent wire and
the fabric's notices: the bytes each wire carries stay the ones earlier versions sent, and the reader keeps its
limits for hostile input."""

from __future__ import annotations

import struct

import pytest

from poprun_py.executors import wire
from simipu import framing
from simipu.fabric.errors import PeerLostError
from simipu.fabric.frames import header as fabric_wire
from simipu.fabric.join import messages as frames

LENGTH = struct.Struct("!I")


def reader(max_payload: int = 64) -> framing.FrameReader[bytes]:
    return framing.FrameReader(LENGTH, max_payload, lambda n: ValueError(f"{n} is too long"),
                               lambda _header, payload: payload)


def test_every_wire_reads_with_the_one_reader() -> None:
    assert isinstance(wire.FrameDecoder(), framing.FrameReader)
    assert isinstance(frames.FrameReader(), framing.FrameReader)


def test_the_agent_wire_bytes_are_unchanged() -> None:
    """kind, instance (signed), length, big-endian; JSON compact: what a remote agent of this version expects."""
    assert wire.encode_json(wire.Kind.SIGNAL, {"signum": 15}) == b'\x09\xff\xff\xff\xff\x00\x00\x00\x0d{"signum":15}'
    assert wire.encode(wire.Kind.STDOUT, b"hi\n", 3) == b"\x04\x00\x00\x00\x03\x00\x00\x00\x03hi\n"


def test_the_rendezvous_and_notice_bytes_are_unchanged() -> None:
    assert frames.encode_frame({"hb": 1}) == b'\x00\x00\x00\x08{"hb":1}'
    notice = fabric_wire.abort_notice(PeerLostError(2, "gone"))
    assert notice.endswith(b'{"instance": 2, "reason": "gone"}')  # json's default spacing, as always
    hlen = fabric_wire.header_length(notice, 0)
    assert hlen is not None
    lost = fabric_wire.unexpected(1, notice, hlen, len(notice) - hlen)
    assert isinstance(lost, PeerLostError) and lost.instance == 2


@pytest.mark.parametrize("piece", [1, 3, 1000])
def test_frames_split_anywhere_come_out_whole(piece: int) -> None:
    data = b"".join(framing.pack_frame(LENGTH, body) for body in (b"one", b"", b"three"))
    chunks = [data[i:i + piece] for i in range(0, len(data), piece)]
    frames_read = reader()
    got = []
    while (frame := frames_read.next_frame(lambda: chunks.pop(0) if chunks else b"")) is not None:
        got.append(frame)
    assert got == [b"one", b"", b"three"] and frames_read.pending == 0


def test_a_length_over_the_limit_is_refused_before_its_payload_arrives() -> None:
    with pytest.raises(ValueError, match="65 is too long"):
        reader().add(LENGTH.pack(65))


def test_a_cut_off_frame_is_pending_at_the_end_of_the_stream() -> None:
    data = framing.pack_frame(LENGTH, b"payload")[:-2]
    chunks = [data]
    frames_read = reader()
    assert frames_read.next_frame(lambda: chunks.pop() if chunks else b"") is None
    assert frames_read.pending == len(data)


@pytest.mark.parametrize(("body", "why"), [
    (b"\xff\xfe", "not JSON"),
    (b"{", "not JSON"),
    (b"[1, 2]", "not a JSON object"),
    (b"[" * 100_000, "nested too deeply|not JSON"),
])
def test_every_broken_body_is_one_value_error(body: bytes, why: str) -> None:
    with pytest.raises(ValueError, match=f"a test body is ({why})"):
        framing.parse_object(body, "a test body")
