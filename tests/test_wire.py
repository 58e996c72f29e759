"""The agent protocol's framing, fed from bytes: any split of the stream gives the same frames."""

from __future__ import annotations

import pytest

from poprun_py.executors import wire


def stream() -> tuple[bytes, list[wire.Frame]]:
    frames = [
        wire.Frame(wire.Kind.HELLO, -1, b'{"version":"0.1.0"}'),
        wire.Frame(wire.Kind.STDOUT, 3, b"line one\n\xff\xfe not utf-8 \r"),
        wire.Frame(wire.Kind.STDERR, 0, b""),
        wire.Frame(wire.Kind.EXITED, 7, b'{"pid":1,"returncode":0,"signal":null}'),
    ]
    return b"".join(wire.encode(f.kind, f.payload, f.instance) for f in frames), frames


@pytest.mark.parametrize("piece", [1, 2, 3, 7, 9, 1000])
def test_any_split_of_the_stream_gives_the_same_frames(piece: int) -> None:
    data, frames = stream()
    decoder = wire.FrameDecoder()
    got = []
    for start in range(0, len(data), piece):
        got.extend(decoder.feed(data[start:start + piece]))
    assert got == frames and decoder.pending == 0


def test_a_cut_off_frame_stays_pending() -> None:
    data, frames = stream()
    decoder = wire.FrameDecoder()
    assert decoder.feed(data[:-1]) == frames[:-1]
    assert decoder.pending == len(data[:-1]) - sum(wire.HEADER.size + len(f.payload) for f in frames[:-1])


def test_json_frames_round_trip() -> None:
    (frame,) = wire.FrameDecoder().feed(wire.encode_json(wire.Kind.SIGNAL, {"signum": 15}))
    assert frame.kind == wire.Kind.SIGNAL and frame.json() == {"signum": 15}


def test_garbage_is_a_protocol_error_not_a_huge_allocation() -> None:
    with pytest.raises(wire.ProtocolError, match="too large"):
        wire.FrameDecoder().feed(wire.HEADER.pack(wire.Kind.STDOUT, 0, wire.MAX_PAYLOAD + 1))
    with pytest.raises(wire.ProtocolError, match="unknown frame kind"):
        wire.FrameDecoder().feed(b"Welcome to the login banner of this host\n")


@pytest.mark.parametrize("piece", [1, 5, 4096])
def test_what_a_login_shell_prints_before_the_agent_is_skipped(piece: int) -> None:
    data, frames = stream()
    banner = b"Welcome to node7!\nLast login: yesterday\n\0poprun-age"
    decoder = wire.FrameDecoder(after_magic=True)
    whole = banner + wire.MAGIC + data
    got = []
    for start in range(0, len(whole), piece):
        got.extend(decoder.feed(whole[start:start + piece]))
    assert got == frames and decoder.noise == banner
