"""Holders and leases in the V-IPU service, embedded and over HTTP: who holds a partition, and when it goes.

A lease of a process that has ended is made from a real child: its pid and
start time are read while it runs, then it is killed and reaped.
"""

from __future__ import annotations

import socket
import sqlite3
import subprocess
from dataclasses import replace
from pathlib import Path
from typing import Iterator

import pytest

from simipu.vipu import Lease, PartitionInUse, PartitionRequest, VipuApi, VipuClient, VipuService
from simipu.vipu.lease import boot_id, process_start
from simipu.vipu.server import VipuServer


@pytest.fixture(params=["embedded", "http"])
def api(request: pytest.FixtureRequest, tmp_path: Path) -> Iterator[VipuApi]:
    service = VipuService(tmp_path / "vipu.sqlite")
    if request.param == "embedded":
        yield service
        return
    with VipuServer(service, host="127.0.0.1", port=0, token="t0k3n").start() as server:
        host, port = server.address
        yield VipuClient(host, port=port, timeout=10, token="t0k3n")


@pytest.fixture
def dead_lease() -> Lease:
    child = subprocess.Popen(["sleep", "60"])
    start = process_start(child.pid)
    child.kill()
    child.wait(10)
    assert start is not None
    return Lease(host=socket.gethostname(), boot=boot_id(), pid=child.pid, start=start, job="gone")


def me(job: str = "mine") -> Lease:
    return Lease.of_this_process(job)


def test_a_held_partition_is_its_holders_alone(api: VipuApi) -> None:
    api.create_partition(PartitionRequest("p", 4))
    held = api.claim_partition("p", me())
    assert held.holders == (me(),) and held.in_use
    assert api.claim_partition("p", me()).holders == (me(),)  # the holder again: idempotent
    other = me("another launch in this process")
    with pytest.raises(PartitionInUse, match="in use by pid"):
        api.claim_partition("p", other)
    with pytest.raises(PartitionInUse):
        api.reset_partition("p", other)
    with pytest.raises(PartitionInUse):
        api.update_partition("p", PartitionRequest("p", 8), other)
    with pytest.raises(PartitionInUse):
        api.remove_partition("p")
    assert api.mark_failed("p").state == "PS_FAILED"  # a hardware error spares no one
    assert api.reset_partition("p", me()).reset_count == 1  # the holder may
    assert api.release_partition("p", me()).holders == ()
    assert api.claim_partition("p", other).holders == (other,)


def test_a_dead_launchs_temporary_partition_is_gone(api: VipuApi, dead_lease: Lease, tmp_path: Path) -> None:
    api.create_partition(PartitionRequest("kept", 4), holder=dead_lease)
    api.create_partition(PartitionRequest("temporary", 4), holder=dead_lease, temporary=True)
    # its holds and its temporary partition are invisible at once, and dropped by the next change
    assert [(p.name, p.holders) for p in api.list_partitions()] == [("kept", ())]
    assert api.create_partition(PartitionRequest("next", 4)).ipus == (4, 5, 6, 7)
    with sqlite3.connect(tmp_path / "vipu.sqlite") as db:
        assert db.execute("SELECT count(*) FROM holds").fetchone() == (0,)
        assert db.execute("SELECT name FROM partitions ORDER BY name").fetchall() == [("kept",), ("next",)]


def test_a_lease_of_another_host_stays_until_that_host_says_it_is_gone(api: VipuApi) -> None:
    remote = replace(me(), host="elsewhere.invalid")
    assert remote.alive() is None  # only its own host can tell
    api.create_partition(PartitionRequest("theirs", 4), holder=remote, temporary=True)
    api.create_partition(PartitionRequest("mine", 4))
    assert [p.name for p in api.list_partitions()] == ["mine", "theirs"]
    with pytest.raises(PartitionInUse):
        api.reclaim(me())  # a live process of this host is not reclaimed on anyone's word
    assert api.reclaim(remote) == ["theirs"]
    assert [p.name for p in api.list_partitions()] == ["mine"]


def test_a_state_file_from_before_leases_is_upgraded(tmp_path: Path) -> None:
    state = tmp_path / "vipu.sqlite"
    VipuService(state).create_partition(PartitionRequest("old", 4))
    with sqlite3.connect(state) as db:  # as the first schema left it
        db.execute("DROP TABLE holds")
        db.execute("ALTER TABLE partitions DROP COLUMN lease")
        db.execute("UPDATE meta SET value = '1' WHERE key = 'schema_version'")
    service = VipuService(state)
    assert service.claim_partition("old", me()).holders == (me(),)
