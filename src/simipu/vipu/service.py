"""The V-IPU service over a SQLite state file: partitions survive restarts, allocation is atomic.

Every operation opens its own connection and runs in one transaction;
writes start with ``BEGIN IMMEDIATE``, so reading the taken IPUs, choosing
free ones and recording them is one step no other process or thread can
interleave with (the race of the guide's "Known issues" cannot happen).
The ``UNIQUE(cluster, ipu)`` constraint is the second line of defence.
A connection per operation also makes one service object safe to share
between the HTTP server's threads.

The service also keeps who holds which IPU (``holds``), whoever asks and
from whatever state directory: a holder is a ``Lease`` that dies with its
process. A partition held by a live process is never reset, updated or
removed by another; a temporary partition carries its creator's lease and
is removed once the creator is gone. Leases of this host are checked here
(a dead one is reclaimed by the next write); leases of other hosts are
reclaimed when a process on that host says they are dead (``reclaim``).
"""

from __future__ import annotations

import json
import logging
import os
import sqlite3
import time
from contextlib import contextmanager
from pathlib import Path
from typing import Iterator, Optional

from simipu import hardware
from simipu.private_files import UnsafePath, private_dir, private_file
from simipu.vipu.allocation import choose_ipus
from simipu.vipu.defaults import default_state_path, own_state_dir
from simipu.vipu.errors import (
    ClusterMismatch,
    ClusterNotFound,
    InvalidPartitionRequest,
    NotEnoughIpus,
    PartitionExists,
    PartitionInUse,
    PartitionNotFound,
    VipuStateError,
)
from simipu.vipu.lease import Lease
from simipu.vipu.models import (
    DEFAULT_CLUSTER_NAME,
    PS_ACTIVE,
    PS_FAILED,
    Cluster,
    Partition,
    PartitionRequest,
    check_cluster_name,
    check_partition_name,
)

log = logging.getLogger("simipu.vipu")

SCHEMA_VERSION = "2"
#: How a user picks another state file, in the errors about this one: simipu's option, or (poprun's embedded
#: service, which has no option for it) the directory it keeps its file in.
_ANOTHER_STATE = "use another state file (simipu: --state FILE; poprun: another XDG_STATE_HOME)"
#: What to do about a state file (or its directory) that others own or can write: one of one's own, and to share
#: partitions, the server, which changes them only for holders of its token.
_OWN_STATE = ("keep the state file in a directory only you can write (mode 0700; the default "
              "$XDG_STATE_HOME/poprun-py is one); to share partitions with others, run 'simipu vipu-server' over "
              "it and have them use --server")
_SCHEMA = """
CREATE TABLE IF NOT EXISTS meta (key TEXT PRIMARY KEY, value TEXT NOT NULL);
CREATE TABLE IF NOT EXISTS clusters (name TEXT PRIMARY KEY, size INTEGER NOT NULL);
CREATE TABLE IF NOT EXISTS partitions (
    name TEXT PRIMARY KEY,
    cluster TEXT NOT NULL REFERENCES clusters(name),
    size INTEGER NOT NULL,
    num_ilds INTEGER NOT NULL,
    num_gcds INTEGER NOT NULL,
    reconfigurable INTEGER NOT NULL,
    ipu_link_routing_type TEXT NOT NULL,
    gw_link_routing_type TEXT NOT NULL,
    sync_type TEXT NOT NULL,
    state TEXT NOT NULL,
    reset_count INTEGER NOT NULL DEFAULT 0,
    lease TEXT
);
CREATE TABLE IF NOT EXISTS partition_ipus (
    cluster TEXT NOT NULL,
    ipu INTEGER NOT NULL,
    partition TEXT NOT NULL REFERENCES partitions(name),
    position INTEGER NOT NULL,
    UNIQUE (cluster, ipu)
);
CREATE INDEX IF NOT EXISTS partition_ipus_by_partition ON partition_ipus (partition, position);
CREATE TABLE IF NOT EXISTS holds (
    cluster TEXT NOT NULL,
    ipu INTEGER NOT NULL,
    partition TEXT NOT NULL REFERENCES partitions(name),
    holder TEXT NOT NULL,
    since REAL NOT NULL,
    UNIQUE (cluster, ipu)
);
"""
_COLUMNS = ("name, cluster, size, num_ilds, num_gcds, reconfigurable, ipu_link_routing_type, "
            "gw_link_routing_type, sync_type, state, reset_count, lease")


def _lease_text(lease: Lease) -> str:
    return json.dumps(lease.to_json(), sort_keys=True)


def _lease_of(text: Optional[str]) -> Optional[Lease]:
    return Lease.from_json(json.loads(text)) if text else None


class VipuService:
    """The embedded V-IPU service (implements ``VipuApi``) over ``state_path``.

    ``cluster`` sizes the default cluster ``cluster_name`` when the state file
    does not have it yet: ``pod16``, ``pod64`` (the default), ``pod128``,
    ``pod256`` or a number of IPUs. Naming a different size for a cluster the
    file already holds raises ``ClusterMismatch`` rather than silently
    changing hardware under existing partitions.
    """

    def __init__(self, state_path: Optional[os.PathLike[str] | str] = None, cluster: Optional[str | int] = None,
                 cluster_name: str = DEFAULT_CLUSTER_NAME, busy_timeout: float = 30.0) -> None:
        self.state_path = Path(state_path) if state_path is not None else default_state_path()
        self.default_cluster = check_cluster_name(cluster_name)
        self._busy_timeout = busy_timeout
        try:
            size = hardware.parse_cluster_size(cluster if cluster is not None else "pod64")
        except ValueError as exc:
            raise InvalidPartitionRequest(f"cluster {cluster_name}: {exc}") from None
        self._refuse_unsafe_state(explicit=state_path is not None)
        with self._transaction() as db:
            for statement in filter(str.strip, _SCHEMA.split(";")):
                db.execute(statement)
            row = db.execute("SELECT value FROM meta WHERE key = 'schema_version'").fetchone()
            if row is None:
                db.execute("INSERT INTO meta VALUES ('schema_version', ?)", (SCHEMA_VERSION,))
            elif row[0] == "1":  # before leases: partitions gain a lease column (holds is new)
                db.execute("ALTER TABLE partitions ADD COLUMN lease TEXT")
                db.execute("UPDATE meta SET value = ? WHERE key = 'schema_version'", (SCHEMA_VERSION,))
            elif row[0] != SCHEMA_VERSION:
                raise VipuStateError(
                    f"the V-IPU state file {self.state_path} has schema version {row[0]}, this simipu reads "
                    f"{SCHEMA_VERSION}; {_ANOTHER_STATE}"
                )
            stored = db.execute("SELECT size FROM clusters WHERE name = ?", (cluster_name,)).fetchone()
            if stored is None:
                db.execute("INSERT INTO clusters VALUES (?, ?)", (cluster_name, size))
                log.info("created cluster %s of %d IPUs in %s", cluster_name, size, self.state_path)
            elif cluster is not None and stored[0] != size:
                raise ClusterMismatch(
                    f"the V-IPU state file {self.state_path} holds cluster {cluster_name} of {stored[0]} IPUs, "
                    f"not {size}; drop --cluster, or {_ANOTHER_STATE}"
                )

    def _refuse_unsafe_state(self, explicit: bool) -> None:
        """Whoever can write the state file, or the directory it is in, can rewrite partitions and leases without
        the server's token: both must be ours alone, the default as a file named with ``--state``."""
        if not explicit:  # the user's own state directory: 0700, refused unless theirs alone (StateDirUnusable)
            own_state_dir()
        else:
            self._private_state_parent()
        try:
            private_file(self.state_path, _OWN_STATE)
        except UnsafePath as exc:
            raise VipuStateError(f"unsafe V-IPU state file: {exc}") from None

    def _private_state_parent(self) -> None:
        """A state file named with ``--state`` is checked where it really is (symlinks followed), and opened there."""
        try:
            self.state_path = self.state_path.resolve()
            private_dir(self.state_path.parent, _OWN_STATE, _OWN_STATE)
        except UnsafePath as exc:
            raise VipuStateError(f"unsafe V-IPU state directory: {exc}") from None
        except (OSError, RuntimeError) as exc:  # RuntimeError: a symlink loop, before Python 3.13
            raise VipuStateError(f"cannot create the directory of the V-IPU state file {self.state_path}: {exc}") from None

    def __repr__(self) -> str:
        return f"VipuService({str(self.state_path)!r}, cluster_name={self.default_cluster!r})"

    # -- transactions ----------------------------------------------------

    @contextmanager
    def _transaction(self, write: bool = True) -> Iterator[sqlite3.Connection]:
        """One connection, one transaction; SQLite errors become VipuStateError naming the file."""
        db: Optional[sqlite3.Connection] = None
        try:
            db = sqlite3.connect(self.state_path, timeout=self._busy_timeout, isolation_level=None)
            db.execute("BEGIN IMMEDIATE" if write else "BEGIN")
            yield db
            db.execute("COMMIT")
        except sqlite3.IntegrityError as exc:
            # Cannot happen under BEGIN IMMEDIATE; if it ever does, it is a lost allocation race.
            raise NotEnoughIpus(f"allocation conflict in {self.state_path}: {exc}; try again") from None
        except sqlite3.OperationalError as exc:
            if "locked" in str(exc) or "busy" in str(exc):
                raise VipuStateError(
                    f"the V-IPU state file {self.state_path} stayed locked for {self._busy_timeout:g} s by another "
                    "process; try again"
                ) from None
            raise VipuStateError(f"cannot use the V-IPU state file {self.state_path}: {exc}") from None
        except sqlite3.DatabaseError as exc:
            raise VipuStateError(
                f"{self.state_path} is not a usable V-IPU state file ({exc}); move it away, or {_ANOTHER_STATE}"
            ) from None
        finally:
            if db is not None:
                if db.in_transaction:
                    db.execute("ROLLBACK")
                db.close()

    # -- reading ---------------------------------------------------------

    def _cluster(self, db: sqlite3.Connection, name: Optional[str]) -> Cluster:
        name = name or self.default_cluster
        row = db.execute("SELECT name, size FROM clusters WHERE name = ?", (name,)).fetchone()
        if row is None:
            known = ", ".join(r[0] for r in db.execute("SELECT name FROM clusters ORDER BY name"))
            raise ClusterNotFound(f"no V-IPU cluster named {name!r} (known: {known or 'none'})")
        return Cluster(name=row[0], size=row[1])

    def _partitions(self, db: sqlite3.Connection, name: Optional[str] = None, hide_dead: bool = True) -> list[Partition]:
        """The partitions as a reader should see them: a dead lease's partition or hold is gone already."""
        where, args = ("WHERE name = ?", (name,)) if name is not None else ("", ())
        rows = db.execute(f"SELECT {_COLUMNS} FROM partitions {where} ORDER BY name", args).fetchall()
        ipus: dict[str, list[int]] = {}
        ipu_where = "WHERE partition = ?" if name is not None else ""
        for partition, ipu in db.execute(
            f"SELECT partition, ipu FROM partition_ipus {ipu_where} ORDER BY partition, position", args
        ):
            ipus.setdefault(partition, []).append(ipu)
        holders: dict[str, list[Lease]] = {}
        for partition, text in db.execute(f"SELECT DISTINCT partition, holder FROM holds {ipu_where}", args):
            holder = _lease_of(text)
            if holder is not None and not (hide_dead and holder.alive() is False):
                holders.setdefault(partition, []).append(holder)
        clusters = {n: Cluster(n, s) for n, s in db.execute("SELECT name, size FROM clusters")}
        found = []
        for row in rows:
            lease = _lease_of(row[11])
            if hide_dead and lease is not None and lease.alive() is False:
                continue  # its creator is gone: reclaimed by the next write
            owned = tuple(ipus.get(row[0], ()))
            cluster = clusters[row[1]]
            ilds = tuple(dict.fromkeys(cluster.ild_of(i) for i in owned))
            found.append(Partition(
                name=row[0], cluster=row[1], size=row[2], num_ilds=row[3], num_gcds=row[4],
                reconfigurable=bool(row[5]), ipu_link_routing_type=row[6], gw_link_routing_type=row[7],
                sync_type=row[8], state=row[9], ipus=owned, ilds=ilds, reset_count=row[10], lease=lease,
                holders=tuple(sorted(holders.get(row[0], []), key=lambda h: (h.host, h.pid))),
            ))
        return found

    def _partition(self, db: sqlite3.Connection, name: str, hide_dead: bool = True) -> Partition:
        check_partition_name(name)
        found = self._partitions(db, name, hide_dead)
        if not found:
            raise PartitionNotFound(f"no V-IPU partition named {name!r}; 'simipu vipu list partitions' lists those "
                                    "there are")
        return found[0]

    def _taken(self, db: sqlite3.Connection, cluster: str, excluding: Optional[str] = None) -> set[int]:
        return {ipu for ipu, in db.execute(
            "SELECT ipu FROM partition_ipus WHERE cluster = ? AND partition IS NOT ?", (cluster, excluding)
        )}

    def _store_ipus(self, db: sqlite3.Connection, cluster: str, name: str, ipus: tuple[int, ...]) -> None:
        db.execute("DELETE FROM partition_ipus WHERE partition = ?", (name,))
        db.executemany("INSERT INTO partition_ipus (cluster, ipu, partition, position) VALUES (?, ?, ?, ?)",
                       [(cluster, ipu, name, i) for i, ipu in enumerate(ipus)])

    # -- leases ----------------------------------------------------------

    def _reclaim_dead(self, db: sqlite3.Connection) -> None:
        """Drop the holds and temporary partitions of processes of this host that are gone."""
        texts = {t for t, in db.execute("SELECT DISTINCT holder FROM holds")}
        texts |= {t for t, in db.execute("SELECT DISTINCT lease FROM partitions WHERE lease IS NOT NULL")}
        for text in texts:
            lease = _lease_of(text)
            if lease is not None and lease.alive() is False:
                self._drop_lease(db, text, f"{lease.describe()} is gone")

    def _drop_lease(self, db: sqlite3.Connection, text: str, why: str) -> None:
        db.execute("DELETE FROM holds WHERE holder = ?", (text,))
        for name, in db.execute("SELECT name FROM partitions WHERE lease = ?", (text,)).fetchall():
            self._delete(db, name)
            log.info("reclaimed temporary partition %s: %s", name, why)

    @staticmethod
    def _delete(db: sqlite3.Connection, name: str) -> None:
        for table, column in (("holds", "partition"), ("partition_ipus", "partition"), ("partitions", "name")):
            db.execute(f"DELETE FROM {table} WHERE {column} = ?", (name,))

    @staticmethod
    def _refuse_if_used_by_another(partition: Partition, holder: Optional[Lease], doing: str) -> None:
        """A partition held by a live process (or its temporary one) is that process's alone."""
        for other in (partition.lease, *partition.holders):
            if other is not None and not other.same_holder(holder):
                raise PartitionInUse(
                    f"cannot {doing} partition {partition.name}: it is in use by {other.describe()}; "
                    "wait for that job to end, or use another partition"
                )

    def _hold(self, db: sqlite3.Connection, partition: Partition, holder: Lease) -> None:
        text = _lease_text(holder)
        db.execute("DELETE FROM holds WHERE partition = ? AND holder = ?", (partition.name, text))
        db.executemany("INSERT INTO holds (cluster, ipu, partition, holder, since) VALUES (?, ?, ?, ?, ?)",
                       [(partition.cluster, ipu, partition.name, text, time.time()) for ipu in partition.ipus])

    # -- VipuApi ---------------------------------------------------------

    def create_partition(self, request: PartitionRequest, holder: Optional[Lease] = None,
                         temporary: bool = False) -> Partition:
        if temporary and holder is None:
            raise InvalidPartitionRequest(f"partition {request.name}: a temporary partition needs a holder's lease")
        with self._transaction() as db:
            self._reclaim_dead(db)
            cluster = self._cluster(db, request.cluster)
            if db.execute("SELECT 1 FROM partitions WHERE name = ?", (request.name,)).fetchone():
                raise PartitionExists(
                    f"a V-IPU partition named {request.name!r} exists already; use it, or remove it first "
                    "(simipu vipu remove partition)"
                )
            ipus = choose_ipus(cluster, self._taken(db, cluster.name), request)
            db.execute(
                f"INSERT INTO partitions ({_COLUMNS}) VALUES (?, ?, ?, ?, ?, ?, ?, ?, ?, ?, 0, ?)",
                (request.name, cluster.name, request.size, request.num_ilds, request.num_gcds,
                 int(request.reconfigurable), request.resolved_ipu_link_routing_type(),
                 request.resolved_gw_link_routing_type(), request.resolved_sync_type(), PS_ACTIVE,
                 _lease_text(holder) if temporary and holder else None),
            )
            self._store_ipus(db, cluster.name, request.name, ipus)
            if holder is not None:
                self._hold(db, self._partition(db, request.name, hide_dead=False), holder)
            partition = self._partition(db, request.name, hide_dead=False)
        log.info("created partition %s: %d IPUs %s of %s", partition.name, partition.size, list(ipus), cluster.name)
        return partition

    def get_partition(self, name: str) -> Partition:
        with self._transaction(write=False) as db:
            return self._partition(db, name)

    def list_partitions(self) -> list[Partition]:
        with self._transaction(write=False) as db:
            return self._partitions(db)

    def claim_partition(self, name: str, holder: Lease) -> Partition:
        """Hold every IPU of partition ``name`` for ``holder``; PartitionInUse if another live process does."""
        with self._transaction() as db:
            self._reclaim_dead(db)
            partition = self._partition(db, name)
            self._refuse_if_used_by_another(partition, holder, "use")
            self._hold(db, partition, holder)
            partition = self._partition(db, name)
        log.info("partition %s held by %s", name, holder.describe())
        return partition

    def release_partition(self, name: str, holder: Lease) -> Partition:
        """Let go of the IPUs ``holder`` holds in partition ``name`` (idempotent)."""
        with self._transaction() as db:
            db.execute("DELETE FROM holds WHERE partition = ? AND holder = ?", (name, _lease_text(holder)))
            return self._partition(db, name)

    def reclaim(self, lease: Lease) -> list[str]:
        """Drop what a process that is gone held; a caller on its host vouches for that. Returns partitions removed."""
        if lease.alive():
            raise PartitionInUse(f"{lease.describe()} is alive; only its own process releases what it holds")
        text = _lease_text(lease)
        with self._transaction() as db:
            removed = [n for n, in db.execute("SELECT name FROM partitions WHERE lease = ?", (text,))]
            self._drop_lease(db, text, f"{lease.describe()} is gone")
        return removed

    def update_partition(self, name: str, request: PartitionRequest, holder: Optional[Lease] = None) -> Partition:
        if request.name != name:
            raise InvalidPartitionRequest(
                f"cannot update partition {name!r} with a request for {request.name!r}; partitions are not renamed"
            )
        with self._transaction() as db:
            self._reclaim_dead(db)
            current = self._partition(db, name)
            self._refuse_if_used_by_another(current, holder, "update")
            cluster = self._cluster(db, request.cluster or current.cluster)
            same_place = (cluster.name, request.size, request.num_ilds) == (current.cluster, current.size, current.num_ilds)
            ipus = current.ipus if same_place else choose_ipus(cluster, self._taken(db, cluster.name, name), request)
            if request.sync_type or request.reconfigurable != current.reconfigurable:
                sync_type = request.resolved_sync_type()
            else:
                sync_type = current.sync_type
            db.execute(
                "UPDATE partitions SET cluster = ?, size = ?, num_ilds = ?, num_gcds = ?, reconfigurable = ?, "
                "ipu_link_routing_type = ?, gw_link_routing_type = ?, sync_type = ?, state = ? WHERE name = ?",
                (cluster.name, request.size, request.num_ilds, request.num_gcds, int(request.reconfigurable),
                 request.ipu_link_routing_type or current.ipu_link_routing_type,
                 request.gw_link_routing_type or current.gw_link_routing_type,
                 sync_type, PS_ACTIVE, name),
            )
            if not same_place:
                db.execute("DELETE FROM holds WHERE partition = ?", (name,))
                self._store_ipus(db, cluster.name, name, ipus)
                if holder is not None and current.holders:
                    self._hold(db, self._partition(db, name), holder)
            partition = self._partition(db, name)
        log.info("updated partition %s: %d IPUs %s", name, partition.size, list(partition.ipus))
        return partition

    def _set_state(self, name: str, state: str, count_reset: bool, holder: Optional[Lease]) -> Partition:
        with self._transaction() as db:
            self._reclaim_dead(db)
            partition = self._partition(db, name)
            if count_reset:
                self._refuse_if_used_by_another(partition, holder, "reset")
            db.execute("UPDATE partitions SET state = ?, reset_count = reset_count + ? WHERE name = ?",
                       (state, int(count_reset), name))
            return self._partition(db, name)

    def reset_partition(self, name: str, holder: Optional[Lease] = None) -> Partition:
        partition = self._set_state(name, PS_ACTIVE, True, holder)
        log.info("reset partition %s (reset %d)", name, partition.reset_count)
        return partition

    def mark_failed(self, name: str) -> Partition:
        """As a hardware error would, whoever holds the partition (the test and admin hook)."""
        partition = self._set_state(name, PS_FAILED, False, None)
        log.info("partition %s marked %s", name, PS_FAILED)
        return partition

    def remove_partition(self, name: str, holder: Optional[Lease] = None) -> Partition:
        with self._transaction() as db:
            self._reclaim_dead(db)
            partition = self._partition(db, name)
            self._refuse_if_used_by_another(partition, holder, "remove")
            self._delete(db, name)
        log.info("removed partition %s, freeing IPUs %s", name, list(partition.ipus))
        return partition

    def cluster(self, name: Optional[str] = None) -> Cluster:
        with self._transaction(write=False) as db:
            return self._cluster(db, name)

    def list_clusters(self) -> list[Cluster]:
        with self._transaction(write=False) as db:
            return [Cluster(n, s) for n, s in db.execute("SELECT name, size FROM clusters ORDER BY name")]
