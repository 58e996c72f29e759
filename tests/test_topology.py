"""The --print-topology table, against the real table and the rules behind it."""

from __future__ import annotations

import pytest

from poprun_py.topology import (
    HOST_NAMES_MAX_LINE,
    TopologyRow,
    column_width,
    render_table,
    render_topology,
    topology_rows,
)

# Copied byte for byte from the log of a real poprun run (--print-topology=yes).
REAL_TABLE = """\
 ===========================================
|              poprun topology              |
|===========================================|
| hosts     |           localhost           |
|-----------|-------------------------------|
| ILDs      |               0               |
|-----------|-------------------------------|
| instances |       0       |       1       |
|-----------|-------------------------------|
| replicas  | 0 | 1 | 2 | 3 | 4 | 5 | 6 | 7 |
 -------------------------------------------"""


def cells_of(line: str) -> list[str]:
    """The cells of a data line, right of the name column, bars removed."""
    return line.split("|")[2:-1]


def bars(line: str) -> set[int]:
    return {index for index, char in enumerate(line) if char == "|"}


def assert_well_formed(table: str) -> None:
    """The structural rules of the real tables, for any size."""
    lines = table.split("\n")
    inner = len(lines[2]) - 2
    assert lines[0] == " " + "=" * inner
    assert lines[1].startswith("|") and lines[1].endswith("|") and len(lines[1]) == inner + 2
    assert lines[1][1:-1].strip() == "poprun topology"
    assert lines[2] == "|" + "=" * inner + "|"
    assert lines[-1] == " " + "-" * inner
    body = lines[3:-1]
    data, separators = body[0::2], body[1::2]
    assert len(data) == 4
    for separator in separators:
        assert separator == "|" + "-" * 11 + "|" + "-" * (inner - 12) + "|"
    for line, name in zip(data, ("hosts", "ILDs", "instances", "replicas")):
        assert len(line) == inner + 2
        assert line[:13] == "| " + name.ljust(9) + " |"
        assert line.endswith("|")
        # Every bar of every row stands on a bar of the replica row.
        assert bars(line) <= bars(data[-1])
        for cell in cells_of(line):
            label = cell.strip()
            left = len(cell) - len(cell.lstrip(" "))
            right = len(cell) - len(cell.rstrip(" "))
            assert left >= 1 and right >= 1, cell
            # Centred; replica labels are left-justified to the widest index first.
            if name != "replicas":
                assert right - left in (0, 1), cell
            assert label


# -- the real table and other exact tables ------------------------------------


def test_real_table_byte_for_byte() -> None:
    assert render_topology(["localhost"], num_ilds=1, num_instances=2, num_replicas=8) == REAL_TABLE


def test_no_hosts_means_localhost() -> None:
    assert render_topology([], 1, 2, 8) == REAL_TABLE


def test_one_instance_one_replica_widens_for_title_and_host() -> None:
    # The title and "localhost" each keep a space either side, so the one
    # replica column widens rather than the title touching the frame.
    assert render_topology(["localhost"], 1, 1, 1) == """\
 =======================
|    poprun topology    |
|=======================|
| hosts     | localhost |
|-----------|-----------|
| ILDs      |     0     |
|-----------|-----------|
| instances |     0     |
|-----------|-----------|
| replicas  |     0     |
 -----------------------"""


def test_sixteen_replicas_use_two_digit_cells() -> None:
    table = render_topology(["localhost"], 1, 4, 16)
    assert table == """\
 ===========================================================================================
|                                      poprun topology                                      |
|===========================================================================================|
| hosts     |                                   localhost                                   |
|-----------|-------------------------------------------------------------------------------|
| ILDs      |                                       0                                       |
|-----------|-------------------------------------------------------------------------------|
| instances |         0         |         1         |         2         |         3         |
|-----------|-------------------------------------------------------------------------------|
| replicas  | 0  | 1  | 2  | 3  | 4  | 5  | 6  | 7  | 8  | 9  | 10 | 11 | 12 | 13 | 14 | 15 |
 -------------------------------------------------------------------------------------------"""
    assert_well_formed(table)


def test_two_hosts_two_ilds_each_ild_spans_one_host() -> None:
    table = render_topology(["10.3.7.153", "10.3.8.153"], 2, 2, 8)
    lines = table.split("\n")
    assert lines[3] == "| hosts     |  10.3.7.153   |  10.3.8.153   |"
    assert lines[5] == "| ILDs      |       0       |       1       |"
    assert_well_formed(table)


def test_one_host_two_ilds_each_ild_spans_half_the_replicas() -> None:
    lines = render_topology(["localhost"], 2, 1, 8).split("\n")
    assert lines[3] == "| hosts     |           localhost           |"
    assert lines[5] == "| ILDs      |       0       |       1       |"
    assert lines[7] == "| instances |               0               |"


def test_ilds_that_do_not_nest_are_drawn_as_they_fall() -> None:
    table = render_topology(["localhost"], 2, 3, 6)
    lines = table.split("\n")
    assert lines[5] == "| ILDs      |     0     |     1     |"
    assert lines[7] == "| instances |   0   |   1   |   2   |"
    assert_well_formed(table)


def test_pod64_structure() -> None:
    hosts = [f"pod64-host{i}" for i in range(4)]
    table = render_topology(hosts, 1, 16, 64)
    assert_well_formed(table)
    lines = table.split("\n")
    hosts_line, instances_line, replicas_line = lines[3], lines[7], lines[9]
    assert [cell.strip() for cell in cells_of(hosts_line)] == hosts
    assert [cell.strip() for cell in cells_of(instances_line)] == [str(i) for i in range(16)]
    assert [cell for cell in cells_of(replicas_line)] == [f" {r:<2} " for r in range(64)]
    # Each host cell covers 4 instances of 4 replicas: 16 cells of 4 plus 15 bars.
    assert {len(cell) for cell in cells_of(hosts_line)} == {16 * 4 + 15}
    assert {len(cell) for cell in cells_of(instances_line)} == {4 * 4 + 3}


@pytest.mark.parametrize(
    ("hosts", "ilds", "instances", "replicas"),
    [
        ([], 1, 1, 1),
        ([], 1, 1, 10),
        ([], 1, 1, 11),
        (["a"], 1, 100, 100),
        (["a", "b"], 2, 2, 2),
        (["a", "b"], 1, 8, 128),
        (["a", "b", "c", "d"], 4, 16, 64),
        (["a", "b", "c", "d"], 2, 4, 1024),
        (["x.example.com"], 4, 2, 4),
    ],
)
def test_tables_are_well_formed(hosts: list[str], ilds: int, instances: int, replicas: int) -> None:
    assert_well_formed(render_topology(hosts, ilds, instances, replicas))


# -- host names that do not fit ------------------------------------------------


def test_long_host_names_become_footnotes() -> None:
    hosts = ["gc-poplar-02.cluster.internal.example.com", "gc-poplar-03.cluster.internal.example.com"]
    output = render_topology(hosts, 1, 2, 8)
    lines = output.split("\n")
    assert lines[3] == "| hosts     |     host0     |     host1     |"
    assert lines[-2:] == [f"host0: {hosts[0]}", f"host1: {hosts[1]}"]
    assert_well_formed("\n".join(lines[:-2]))
    # The table is exactly as wide as it would be without host names.
    assert len(lines[0]) == len(REAL_TABLE.split("\n")[0])


def test_all_hosts_get_short_labels_when_one_does_not_fit() -> None:
    output = render_topology(["a", "a-very-long-host-name-that-will-not-fit.example.com"], 1, 2, 16)
    assert [cell.strip() for cell in cells_of(output.split("\n")[3])] == ["host0", "host1"]
    assert output.split("\n")[-2:] == ["host0: a", "host1: a-very-long-host-name-that-will-not-fit.example.com"]


def test_short_names_in_a_narrow_table_widen_it_instead() -> None:
    output = render_topology(["node01", "node02"], 1, 2, 2)
    assert "host0" not in output
    lines = output.split("\n")
    assert lines[3] == "| hosts     | node01 | node02 |"
    assert lines[-2] == "| replicas  |   0    |   1    |"
    assert_well_formed(output)
    assert len(lines[1]) <= HOST_NAMES_MAX_LINE


def test_host_names_never_push_a_table_past_a_terminal_line() -> None:
    # Widened for both names, the table would be 12 + 2 * 39 + 1 + 2 = 93 wide.
    hosts = ["one-rather-long-host-name.example.org", "b" * 30]
    lines = render_topology(hosts, 1, 2, 2).split("\n")
    assert lines[-2:] == [f"host0: {hosts[0]}", f"host1: {hosts[1]}"]
    assert max(len(line) for line in lines[:-2]) <= HOST_NAMES_MAX_LINE


# -- counts that cannot be drawn ---------------------------------------------------


@pytest.mark.parametrize(
    ("hosts", "ilds", "instances", "replicas", "flag"),
    [
        (["a", "b"], 1, 3, 6, "--num-instances 3"),
        (["a", "b"], 1, 1, 2, "--num-instances 1"),
        (["a"], 1, 3, 8, "--num-replicas 8"),
        (["a"], 3, 2, 8, "--num-ilds"),
        (["a"], 1, 0, 8, "--num-instances 0"),
        (["a"], 1, 1, 0, "--num-replicas 0"),
        (["a"], 0, 1, 1, "--num-ilds 0"),
    ],
)
def test_counts_that_do_not_divide_raise(
    hosts: list[str], ilds: int, instances: int, replicas: int, flag: str
) -> None:
    with pytest.raises(ValueError, match=flag):
        topology_rows(hosts, ilds, instances, replicas)
    with pytest.raises(ValueError):
        render_topology(hosts, ilds, instances, replicas)


# -- the generic renderer ----------------------------------------------------------


def test_topology_rows_cells() -> None:
    rows = topology_rows(["h0", "h1"], 1, 4, 8)
    assert [row.name for row in rows] == ["hosts", "ILDs", "instances", "replicas"]
    assert rows[0].cells == (("h0", 4), ("h1", 4))
    assert rows[1].cells == (("0", 8),)
    assert rows[2].cells == (("0", 2), ("1", 2), ("2", 2), ("3", 2))
    assert rows[3].cells == tuple((str(r), 1) for r in range(8))
    assert topology_rows(["h"], 1, 1, 11)[3].cells[0] == ("0 ", 1)


def test_render_table_widens_every_column_for_a_wide_label() -> None:
    rows = (
        TopologyRow("hosts", (("a-wide-label", 2),)),
        TopologyRow("replicas", (("0", 1), ("1", 1))),
    )
    assert column_width(rows) == 7  # 2 * 7 + 1 bar >= 12 + 2 spaces
    table = render_table(rows)
    # The name column fits the longest name given, here "replicas".
    assert table.split("\n")[-2] == "| replicas |   0   |   1   |"
    assert table.split("\n")[3] == "| hosts    | a-wide-label  |"


def test_render_table_custom_title() -> None:
    table = render_table((TopologyRow("replicas", (("0", 1),)),), title="t")
    assert table.split("\n")[1] == "|      t       |"  # odd space on the right


def test_rows_must_cover_the_same_columns() -> None:
    with pytest.raises(ValueError, match="every row must cover the same replicas"):
        render_table((TopologyRow("a", (("0", 2),)), TopologyRow("b", (("0", 1),))))


def test_rows_need_cells_of_positive_span() -> None:
    with pytest.raises(ValueError):
        TopologyRow("a", ())
    with pytest.raises(ValueError):
        TopologyRow("a", (("0", 0),))
    with pytest.raises(ValueError):
        render_table(())


def test_rows_are_frozen() -> None:
    row = TopologyRow("a", (("0", 1),))
    with pytest.raises(AttributeError):
        row.name = "b"  # type: ignore[misc]
