"""Every partition operation and error, through both implementations of VipuApi.

The ``api`` fixture is the embedded service over a state file, and the HTTP
client talking to a server (on 127.0.0.1, a free port) over another state
file: the same calls must give the same records and the same error types.
"""

from __future__ import annotations

import os
import socket
import sqlite3
import subprocess
import threading
from dataclasses import replace
from pathlib import Path
from typing import Iterator

import pytest

from simipu.vipu import (
    PS_ACTIVE,
    PS_FAILED,
    ClusterMismatch,
    ClusterNotFound,
    InvalidPartitionRequest,
    Lease,
    NotEnoughIpus,
    PartitionExists,
    PartitionInUse,
    PartitionNotFound,
    PartitionRequest,
    PartitionTooLarge,
    VipuApi,
    VipuClient,
    VipuService,
    VipuStateError,
    default_state_path,
    open_vipu,
)
from simipu.vipu.lease import boot_id, pid_namespace, process_start
from simipu.vipu.server import VipuServer
from support import run_poprun


@pytest.fixture(params=["embedded", "http"])
def api(request: pytest.FixtureRequest, tmp_path: Path) -> Iterator[VipuApi]:
    service = VipuService(tmp_path / "vipu.sqlite")
    if request.param == "embedded":
        yield service
        return
    with VipuServer(service, host="127.0.0.1", port=0).start() as server:
        host, port = server.address
        yield VipuClient(host, port=port, timeout=10)


def test_both_implement_the_protocol(api: VipuApi) -> None:
    assert isinstance(api, VipuApi)


def test_create_get_list_remove(api: VipuApi) -> None:
    created = api.create_partition(PartitionRequest("p16", 16, num_gcds=2))
    assert created.state == PS_ACTIVE and created.size == 16 and created.cluster == "cluster0"
    assert created.ipus == tuple(range(16)) and created.ilds == (0,) and created.reset_count == 0
    second = api.create_partition(PartitionRequest("a4", 4, reconfigurable=True))
    assert set(second.ipus).isdisjoint(created.ipus)
    assert second.sync_type == "c2-compatible"
    assert api.get_partition("p16") == created
    assert [p.name for p in api.list_partitions()] == ["a4", "p16"]
    assert api.remove_partition("p16") == created
    assert [p.name for p in api.list_partitions()] == ["a4"]
    # The freed IPUs are allocatable again.
    assert api.create_partition(PartitionRequest("again", 16)).ipus == tuple(range(16))


def test_cluster_default_and_named(api: VipuApi) -> None:
    cluster = api.cluster()
    assert (cluster.name, cluster.size, cluster.num_ilds) == ("cluster0", 64, 1)
    assert api.cluster("cluster0") == cluster
    assert api.list_clusters() == [cluster]
    with pytest.raises(ClusterNotFound):
        api.cluster("nowhere")
    with pytest.raises(ClusterNotFound):
        api.create_partition(PartitionRequest("p", 4, cluster="nowhere"))


def test_errors_have_distinct_types(api: VipuApi) -> None:
    api.create_partition(PartitionRequest("p32", 32))
    with pytest.raises(PartitionExists):
        api.create_partition(PartitionRequest("p32", 4))
    with pytest.raises(PartitionTooLarge):
        api.create_partition(PartitionRequest("huge", 128))
    api.create_partition(PartitionRequest("q16", 16))
    with pytest.raises(NotEnoughIpus) as not_enough:
        api.create_partition(PartitionRequest("p32b", 32))
    assert "\n" not in str(not_enough.value)
    for call in (api.get_partition, api.remove_partition, api.reset_partition, api.mark_failed):
        with pytest.raises(PartitionNotFound):
            call("ghost")
    with pytest.raises(PartitionNotFound):
        api.update_partition("ghost", PartitionRequest("ghost", 4))
    with pytest.raises(InvalidPartitionRequest):
        api.update_partition("p32", PartitionRequest("other", 4))
    with pytest.raises(InvalidPartitionRequest):
        api.get_partition("bad/name")
    # Refusals change nothing.
    assert [(p.name, p.size) for p in api.list_partitions()] == [("p32", 32), ("q16", 16)]


def test_failed_state_and_reset(api: VipuApi) -> None:
    api.create_partition(PartitionRequest("p", 4))
    assert api.mark_failed("p").state == PS_FAILED
    assert api.get_partition("p").state == PS_FAILED
    reset = api.reset_partition("p")
    assert (reset.state, reset.reset_count) == (PS_ACTIVE, 1)
    assert api.reset_partition("p").reset_count == 2


def test_update_resizes_when_ipus_are_free_and_keeps_them_otherwise(api: VipuApi) -> None:
    api.create_partition(PartitionRequest("p", 8))
    api.create_partition(PartitionRequest("other", 16))
    same = api.update_partition("p", PartitionRequest("p", 8, num_gcds=2, ipu_link_routing_type="dnc"))
    assert same.ipus == tuple(range(8)) and same.num_gcds == 2 and same.ipu_link_routing_type == "dnc"
    grown = api.update_partition("p", PartitionRequest("p", 32))
    assert len(grown.ipus) == 32 and set(grown.ipus).isdisjoint(api.get_partition("other").ipus)
    # Not enough room for 64 while "other" holds 16: refused, and p is unchanged.
    with pytest.raises(NotEnoughIpus):
        api.update_partition("p", PartitionRequest("p", 64))
    assert api.get_partition("p") == grown
    api.mark_failed("p")
    assert api.update_partition("p", PartitionRequest("p", 32, reconfigurable=True)).state == PS_ACTIVE
    assert api.get_partition("p").sync_type == "c2-compatible"


def test_multi_ild_partitions_on_a_pod128(tmp_path: Path) -> None:
    service = VipuService(tmp_path / "s.sqlite", cluster="pod128")
    wide = service.create_partition(PartitionRequest("wide", 64, num_ilds=2))
    assert wide.ilds == (0, 1) and wide.ipus == tuple(range(32)) + tuple(range(64, 96))
    with pytest.raises(PartitionTooLarge):
        service.create_partition(PartitionRequest("x", 128))


def test_state_survives_close_and_reopen(tmp_path: Path) -> None:
    path = tmp_path / "state" / "vipu.sqlite"
    first = VipuService(path)
    created = first.create_partition(PartitionRequest("p", 16, num_gcds=4, reconfigurable=True))
    first.mark_failed("p")
    del first
    again = VipuService(path)
    assert again.get_partition("p") == replace(created, state=PS_FAILED)
    with pytest.raises(PartitionExists):
        again.create_partition(PartitionRequest("p", 4))


def test_cluster_size_conflicts_with_stored_state(tmp_path: Path) -> None:
    path = tmp_path / "vipu.sqlite"
    VipuService(path, cluster="pod16")
    assert VipuService(path).cluster().size == 16  # no size given: use what is stored
    with pytest.raises(ClusterMismatch):
        VipuService(path, cluster="pod64")
    with pytest.raises(InvalidPartitionRequest):
        VipuService(tmp_path / "other.sqlite", cluster="pod12")


def test_unusable_state_file_is_a_state_error(tmp_path: Path) -> None:
    junk = tmp_path / "junk.sqlite"
    junk.write_bytes(b"this is not a database" * 100)
    with pytest.raises(VipuStateError, match="junk.sqlite"):
        VipuService(junk)
    newer = tmp_path / "newer.sqlite"
    VipuService(newer)
    with sqlite3.connect(newer) as db:
        db.execute("UPDATE meta SET value = '99' WHERE key = 'schema_version'")
    with pytest.raises(VipuStateError, match="schema version 99"):
        VipuService(newer)


def test_poprun_with_an_unusable_state_file_says_how_to_use_another(tmp_path: Path) -> None:
    """poprun's embedded service has no ``--state`` (simipu has): the hint names what poprun takes."""
    state = Path(os.environ["XDG_STATE_HOME"], "poprun-py")
    state.mkdir(parents=True, exist_ok=True)
    (state / "vipu.sqlite").write_bytes(b"x\n")
    result = run_poprun("--num-replicas", "2", "true")
    lines = result.stderr.decode().splitlines()
    assert result.returncode == 77 and len(lines) == 1, lines
    assert lines[0].endswith("is not a usable V-IPU state file (file is not a database); move it away, or use "
                             "another state file (simipu: --state FILE; poprun: another XDG_STATE_HOME)"), lines


def test_default_state_path_honours_xdg(monkeypatch: pytest.MonkeyPatch, tmp_path: Path) -> None:
    monkeypatch.setenv("XDG_STATE_HOME", str(tmp_path / "xdg"))
    assert default_state_path() == tmp_path / "xdg" / "poprun-py" / "vipu.sqlite"
    service = open_vipu()
    assert isinstance(service, VipuService) and service.state_path == default_state_path()
    assert default_state_path().exists()
    monkeypatch.setenv("XDG_STATE_HOME", "relative/ignored")
    monkeypatch.setenv("HOME", str(tmp_path / "home"))
    assert default_state_path() == tmp_path / "home" / ".local" / "state" / "poprun-py" / "vipu.sqlite"
    assert isinstance(open_vipu("127.0.0.1", port=1), VipuClient)


def test_threads_sharing_one_service_never_share_ipus(tmp_path: Path) -> None:
    service = VipuService(tmp_path / "vipu.sqlite")
    outcomes: list[object] = []
    lock = threading.Lock()

    def allocate(worker: int) -> None:
        for i in range(6):
            try:
                result: object = service.create_partition(PartitionRequest(f"t{worker}-{i}", 2)).ipus
            except NotEnoughIpus as exc:
                result = exc
            with lock:
                outcomes.append(result)

    threads = [threading.Thread(target=allocate, args=(w,)) for w in range(8)]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join(60)
    assert not any(t.is_alive() for t in threads)
    granted = [o for o in outcomes if isinstance(o, tuple)]
    # 48 requests of 2 IPUs for 64 IPUs: exactly 32 granted, the rest refused, no IPU twice.
    assert len(outcomes) == 48 and len(granted) == 32
    ipus = [ipu for block in granted for ipu in block]
    assert sorted(ipus) == list(range(64))


def test_embedded_service_can_default_to_a_named_cluster(tmp_path: Path) -> None:
    api = open_vipu(state_path=tmp_path / "vipu.sqlite", cluster_name="A8")
    assert api.cluster().name == "A8"
    assert api.create_partition(PartitionRequest("P8", 8)).cluster == "A8"
    assert api.create_partition(PartitionRequest("Q8", 8, cluster="A8")).ipus == tuple(range(8, 16))
    assert {c.name for c in open_vipu(state_path=tmp_path / "vipu.sqlite").list_clusters()} == {"A8", "cluster0"}


# -- holders and leases: who holds a partition, and when it goes ------------------
# A lease of a process that has ended is made from a real child: its pid and start
# time are read while it runs, then it is killed and reaped.


@pytest.fixture
def dead_lease() -> Lease:
    child = subprocess.Popen(["sleep", "60"])
    start = process_start(child.pid)
    child.kill()
    child.wait(10)
    assert start is not None
    return Lease(host=socket.gethostname(), boot=boot_id(), pid=child.pid, start=start, job="gone",
                 pidns=pid_namespace())


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


def test_a_lease_of_another_pid_namespace_is_never_judged_here(dead_lease: Lease) -> None:
    assert dead_lease.alive() is False
    assert replace(dead_lease, pidns="pid:[1]").alive() is None  # its pid names another process here
