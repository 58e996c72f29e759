"""Host lists, host files and the placement of instances on hosts."""

from __future__ import annotations

import socket
from pathlib import Path

import pytest

from poprun_py.errors import UsageError
from poprun_py.hosts import (
    MAX_HOSTS,
    HostListError,
    HostSpec,
    distribute_instances,
    parse_host_list,
    read_host_file,
    reject_duplicate_hosts,
)


def names(specs: tuple[HostSpec, ...]) -> list[str]:
    return [spec.name for spec in specs]


# -- parse_host_list: accepted forms -----------------------------------------


@pytest.mark.parametrize(
    ("text", "expected"),
    [
        ("a", ["a"]),
        ("a,b", ["a", "b"]),
        (" a , b ", ["a", "b"]),
        ("10.3.7.153,10.3.7.154", ["10.3.7.153", "10.3.7.154"]),
        ("node[01-04,7]", ["node01", "node02", "node03", "node04", "node7"]),
        ("node[8-10]", ["node8", "node9", "node10"]),
        ("node[08-10]", ["node08", "node09", "node10"]),
        ("node[3]", ["node3"]),
        ("node[1-2, 4]", ["node1", "node2", "node4"]),
        ("r[1-2]n[1-2]", ["r1n1", "r1n2", "r2n1", "r2n2"]),
        ("[1-2]x", ["1x", "2x"]),
        ("a,node[1-2],b", ["a", "node1", "node2", "b"]),
        ("gpu[1-2].cluster.example.com", ["gpu1.cluster.example.com", "gpu2.cluster.example.com"]),
        ("my_host-1.local", ["my_host-1.local"]),
    ],
)
def test_parse_host_list_names(text: str, expected: list[str]) -> None:
    assert names(parse_host_list(text)) == expected


def test_parse_user_and_port() -> None:
    assert parse_host_list("alice@a,b:2222,bob@c:22") == (
        HostSpec("a", user="alice"),
        HostSpec("b", port=2222),
        HostSpec("c", user="bob", port=22),
    )


def test_user_and_port_apply_to_every_host_of_a_range() -> None:
    assert parse_host_list("me@node[1-2]:2200") == (
        HostSpec("node1", "me", 2200),
        HostSpec("node2", "me", 2200),
    )


@pytest.mark.parametrize(
    ("text", "expected"),
    [
        ("[::1]:22", HostSpec("::1", port=22)),
        ("[::1]", HostSpec("::1")),
        ("::1", HostSpec("::1")),
        ("fe80::1", HostSpec("fe80::1")),
        ("me@[2001:db8::5]:2022", HostSpec("2001:db8::5", "me", 2022)),
    ],
)
def test_parse_ipv6(text: str, expected: HostSpec) -> None:
    assert parse_host_list(text) == (expected,)


def test_ipv6_and_plain_hosts_mix() -> None:
    assert parse_host_list("[::1]:22,a,[::2]") == (HostSpec("::1", port=22), HostSpec("a"), HostSpec("::2"))


# -- parse_host_list: refused forms ------------------------------------------


@pytest.mark.parametrize(
    ("text", "piece"),
    [
        ("", "empty host list"),
        ("   ", "empty host list"),
        ("a,,b", "empty host name"),
        ("a,", "empty host name"),
        (",a", "empty host name"),
        ("node[3-1]", "'3-1'"),
        ("node[1-2", "unclosed '['"),
        ("node[1-2,b", "unclosed '['"),
        ("node1-2]", "unmatched ']'"),
        ("node[[1-2]]", "nested '['"),
        ("node[]", "bad range ''"),
        ("node[1-]", "bad range '1-'"),
        ("node[a-c]", "bad range 'a-c'"),
        ("node[1,,2]", "bad range ''"),
        ("a:", "bad port ''"),
        ("a:0", "bad port '0'"),
        ("a:65536", "bad port '65536'"),
        ("a:ssh", "bad port 'ssh'"),
        ("a:-1", "bad port '-1'"),
        ("[::1]:x", "bad port 'x'"),
        ("[::1]x", "unexpected 'x'"),
        ("a:b:c", "'a:b:c' is neither host:port nor an IPv6 address"),
        ("@a", "bad user name ''"),
        ("u@v@a", "more than one '@'"),
        (":22", "empty host name"),
        ("no de", "bad host name 'no de'"),
        ("a/b", "bad host name 'a/b'"),
    ],
)
def test_malformed_lists_name_the_bad_piece(text: str, piece: str) -> None:
    with pytest.raises(HostListError) as caught:
        parse_host_list(text)
    message = str(caught.value)
    assert piece in message
    assert "\n" not in message


def test_host_list_error_is_a_value_error_and_a_usage_error() -> None:
    with pytest.raises(ValueError):
        parse_host_list("node[3-1]")
    assert HostListError("x").exit_code == UsageError.exit_code == 2


def test_huge_range_fails_fast() -> None:
    with pytest.raises(HostListError, match="more than"):
        parse_host_list("node[1-1000000]")
    with pytest.raises(HostListError, match="more than"):
        parse_host_list("a[1-1000]b[1-1000]")
    assert len(parse_host_list(f"n[1-{MAX_HOSTS}]")) == MAX_HOSTS


# -- duplicates: refused, because every host gets one equal block -----------


@pytest.mark.parametrize("text", ["a,a", "a,A", "node[1-3],node2", "x@a,y@a", "a:22,a:22", "[::1]:22,[::1]:22"])
def test_duplicate_hosts_are_refused(text: str) -> None:
    with pytest.raises(HostListError, match="appears twice"):
        parse_host_list(text)


@pytest.mark.parametrize("text", ["localhost,127.0.0.1", "127.0.0.1,::1", f"localhost,{socket.gethostname()}",
                                  f"{socket.gethostname().upper()},localhost.localdomain"])
def test_two_names_of_this_machine_are_refused_as_one_host(text: str) -> None:
    """Before, only the same spelling was refused: localhost and this machine's hostname were two hosts, each
    instance local rank 0 of 1, with no OMP_NUM_THREADS share, on the same NUMA node."""
    first, second = text.split(",")
    with pytest.raises(HostListError, match=f"hosts '{first}' and '{second}' in the host list are both this machine"):
        parse_host_list(text)


def test_same_name_on_different_ports_are_different_hosts() -> None:
    assert len(parse_host_list("localhost:2222,localhost:2223,localhost")) == 3


def test_reject_duplicate_hosts_across_sources() -> None:
    hosts = parse_host_list("a,b") + parse_host_list("b")
    with pytest.raises(HostListError, match="'b' appears twice in -H"):
        reject_duplicate_hosts(hosts, "-H")


# -- HostSpec -----------------------------------------------------------------


@pytest.mark.parametrize(
    ("spec", "text"),
    [
        (HostSpec("a"), "a"),
        (HostSpec("a", "me"), "me@a"),
        (HostSpec("a", port=22), "a:22"),
        (HostSpec("a", "me", 22), "me@a:22"),
        (HostSpec("::1"), "::1"),
        (HostSpec("::1", port=22), "[::1]:22"),
        (HostSpec("::1", "me", 22), "me@[::1]:22"),
        (HostSpec("a", slots=4), "a"),
    ],
)
def test_str_is_readable_and_parses_back(spec: HostSpec, text: str) -> None:
    assert str(spec) == text
    (parsed,) = parse_host_list(str(spec))
    assert parsed == HostSpec(spec.name, spec.user, spec.port)


def test_host_spec_is_frozen() -> None:
    spec = HostSpec("a")
    with pytest.raises(AttributeError):
        spec.name = "b"  # type: ignore[misc]


@pytest.mark.parametrize(
    "name",
    ["localhost", "LOCALHOST", "127.0.0.1", "::1", "0:0:0:0:0:0:0:1", socket.gethostname(), socket.getfqdn()],
)
def test_local_hosts(name: str) -> None:
    assert HostSpec(name).is_local


@pytest.mark.parametrize("name", ["127.0.0.2", "127.0.0.3", "127.1.2.3", "10.3.7.153", "node01", "::2"])
def test_other_hosts_are_remote(name: str) -> None:
    assert not HostSpec(name).is_local


@pytest.mark.parametrize(
    "spec", [HostSpec("localhost", port=2222), HostSpec("localhost", user="me"), HostSpec("127.0.0.1", port=22)]
)
def test_explicit_user_or_port_asks_for_ssh(spec: HostSpec) -> None:
    assert not spec.is_local


# -- read_host_file -----------------------------------------------------------


def test_read_host_file(tmp_path: Path) -> None:
    path = tmp_path / "hosts"
    path.write_text(
        "# our pod\n"
        "\n"
        "node1 slots=4\n"
        "   node[2-3]   slots=2   # two more\n"
        "me@node4:2222\n"
        "node5, node6\n"
        "\t\n",
        encoding="utf-8",
    )
    assert read_host_file(path) == (
        HostSpec("node1", slots=4),
        HostSpec("node2", slots=2),
        HostSpec("node3", slots=2),
        HostSpec("node4", "me", 2222),
        HostSpec("node5"),
        HostSpec("node6"),
    )
    assert read_host_file(str(path))[0] == HostSpec("node1", slots=4)


def test_a_host_file_may_start_with_a_byte_order_mark(tmp_path: Path) -> None:
    """As Notepad saves UTF-8; a config file with one is read too. Before: bad host name '\\ufeffnode1'."""
    path = tmp_path / "hosts"
    path.write_bytes(b"\xef\xbb\xbfnode1 slots=2\nnode2\n")
    assert read_host_file(path) == (HostSpec("node1", slots=2), HostSpec("node2"))
    path.write_bytes(b"node1\n\xef\xbb\xbfnode2\n")  # only at the start is it a mark; elsewhere, a mistake
    with pytest.raises(HostListError, match=":2: bad host name"):
        read_host_file(path)


def test_missing_host_file_names_the_path(tmp_path: Path) -> None:
    path = tmp_path / "nope"
    with pytest.raises(HostListError, match=f"cannot read host file {path}"):
        read_host_file(path)


def test_directory_as_host_file_names_the_path(tmp_path: Path) -> None:
    with pytest.raises(HostListError, match=f"cannot read host file {tmp_path}"):
        read_host_file(tmp_path)


def test_binary_host_file_is_refused(tmp_path: Path) -> None:
    path = tmp_path / "hosts"
    path.write_bytes(b"node1\n\xff\xfe\n")
    with pytest.raises(HostListError, match="not UTF-8"):
        read_host_file(path)


@pytest.mark.parametrize(
    ("content", "piece"),
    [
        ("a\nnode[3-1]\n", ":2: range '3-1'"),
        ("a slots=0\n", ":1: bad slots value '0'"),
        ("a slots=four\n", ":1: bad slots value 'four'"),
        ("a slots=\n", ":1: bad slots value ''"),
        ("a max_slots=4\n", ":1: unknown option 'max_slots=4'; only slots=N may follow the hosts (poprun-py has "
                             "no max_slots"),
        ("a slots=1 slots=2\n", ":1: slots= given twice"),
        ("slots=4\n", ":1: empty host list"),
        ("a b\n", ":1: bad host name 'a b'"),
        ("# nothing\n\n", "lists no hosts"),
        ("", "lists no hosts"),
        ("a\nb\na slots=2\n", "'a' appears twice in host file"),
    ],
)
def test_bad_host_files_name_the_line(tmp_path: Path, content: str, piece: str) -> None:
    path = tmp_path / "hosts"
    path.write_text(content, encoding="utf-8")
    with pytest.raises(HostListError) as caught:
        read_host_file(path)
    assert piece in str(caught.value)
    assert str(path) in str(caught.value)


# -- distribute_instances -----------------------------------------------------


@pytest.mark.parametrize(
    ("num_hosts", "num_instances", "expected"),
    [
        (1, 1, (range(0, 1),)),
        (1, 4, (range(0, 4),)),
        (2, 2, (range(0, 1), range(1, 2))),
        (2, 8, (range(0, 4), range(4, 8))),
        (4, 16, (range(0, 4), range(4, 8), range(8, 12), range(12, 16))),
    ],
)
def test_distribute_instances(num_hosts: int, num_instances: int, expected: tuple[range, ...]) -> None:
    blocks = distribute_instances(num_hosts, num_instances)
    assert blocks == expected
    assert [i for block in blocks for i in block] == list(range(num_instances))


def test_uneven_split_says_what_to_use() -> None:
    with pytest.raises(HostListError) as caught:
        distribute_instances(2, 3)
    assert str(caught.value) == "--num-instances 3 cannot be divided evenly among 2 hosts; use a multiple of 2"


@pytest.mark.parametrize(("num_hosts", "num_instances"), [(4, 2), (3, 1), (0, 4), (2, 0), (2, -2)])
def test_impossible_splits_are_refused(num_hosts: int, num_instances: int) -> None:
    with pytest.raises(HostListError):
        distribute_instances(num_hosts, num_instances)
