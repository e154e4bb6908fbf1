"""A node's durable state: SQLite in WAL mode, one file per node.

What is stored is what the protocol was fed: policy announcements, round manifests,
submissions, verdicts, planted groups and training steps, as the bytes that arrived (signatures included), so the
store is also an audit log. :meth:`Store.replay` yields them back as protocol events in an
order the protocol's state does not depend on. A reputation table is a derived snapshot,
rewritten each round for readers (``vrl inspect``-style tools, metrics), never read back.

Durability: every write is one transaction with ``synchronous=FULL``; a message counts as
acknowledged only once its ``put_*`` call has returned, and a ``kill -9`` at any point
leaves the database at the last committed transaction (SQLite's WAL guarantees atomic
commit on process crash: https://sqlite.org/wal.html, https://sqlite.org/atomiccommit.html).
"""

from __future__ import annotations

import hashlib
import secrets
import sqlite3
import threading
from collections.abc import Iterator
from pathlib import Path
from typing import Any, NamedTuple

from vrl.errors import VrlError
from vrl.node.messages import (
    TOPIC_GROUPS,
    TOPIC_MANIFESTS,
    TOPIC_STEPS,
    TOPIC_VERDICTS,
    ManifestLists,
    MessageError,
    PolicyAnnouncement,
    RoundManifest,
    SignedVerdict,
    StepVerdict,
    Submission,
)
from vrl.node.requests import BACKFILL_CURSOR_TABLES, BACKFILL_HAVE_MAX, BACKFILL_MAX_MESSAGES, short_id

# 2: versions and rounds are u64 (specs/network.md §3), which SQLite's signed 64-bit INTEGER
# cannot hold from 2^63 on; they are stored as 8-byte big-endian BLOBs, which compare and
# sort as the numbers do. A version 1 database is migrated in place, in one transaction.
# 3: step verdicts (specs/training.md §5) get a table of their own; a version 2 database
# gains it in place (nothing else changed).
# 4: round manifests (the committee design, specs/committee.md §3.3) get a table of their own,
# one row per round (the first manifest accepted for it, as the protocol uses); a version 3
# (or 2) database gains it in place, in the same one transaction as the schema number.
# 5: the lists behind a paged round manifest (specs/committee.md §3.1), the trainer's own, get
# a table of their own (``manifest_lists``), one row per round; a version 4 (or older) database
# gains it in place. A manifest row of version 1 (every digest listed) is no longer read: the
# node refuses to replay it (vrl.node.catchup), as any message of an earlier protocol.
SCHEMA_VERSION = 5

_TABLES = """
CREATE TABLE IF NOT EXISTS policies (
    version BLOB PRIMARY KEY, model_hash BLOB NOT NULL, blob BLOB NOT NULL, size INTEGER NOT NULL,
    data BLOB NOT NULL, received REAL NOT NULL);
CREATE TABLE IF NOT EXISTS groups (
    digest BLOB PRIMARY KEY, subject BLOB NOT NULL, version BLOB NOT NULL, data BLOB NOT NULL,
    received REAL NOT NULL, planted INTEGER NOT NULL DEFAULT 0);
CREATE TABLE IF NOT EXISTS verdicts (
    id BLOB PRIMARY KEY, grp BLOB NOT NULL, verifier BLOB NOT NULL, subject BLOB NOT NULL,
    version BLOB NOT NULL, outcome TEXT NOT NULL, data BLOB NOT NULL, received REAL NOT NULL,
    UNIQUE (grp, verifier));
CREATE TABLE IF NOT EXISTS trained (
    version BLOB PRIMARY KEY, groups BLOB NOT NULL, metrics TEXT NOT NULL);
CREATE TABLE IF NOT EXISTS steps (
    id BLOB PRIMARY KEY, version BLOB NOT NULL, verifier BLOB NOT NULL, outcome TEXT NOT NULL,
    data BLOB NOT NULL, received REAL NOT NULL, UNIQUE (version, verifier));
CREATE TABLE IF NOT EXISTS manifests (
    round BLOB PRIMARY KEY, trainer BLOB NOT NULL, data BLOB NOT NULL, received REAL NOT NULL);
CREATE TABLE IF NOT EXISTS manifest_lists (
    round BLOB PRIMARY KEY, data BLOB NOT NULL);
CREATE TABLE IF NOT EXISTS reputation (
    node BLOB PRIMARY KEY, round BLOB NOT NULL, score REAL NOT NULL, check_rate REAL NOT NULL,
    quarantined INTEGER NOT NULL, trust REAL NOT NULL, checked_groups INTEGER NOT NULL);
"""
# The prune journal of the storage tier (vrl.node.storage, specs/storage.md §2): one row per blob
# removed (state 'done') or about to be (state 'intent'), with the newest version naming it.
# Created in every schema-3 store at open: a store without it is still read (not a schema change).
_PRUNED = """
CREATE TABLE IF NOT EXISTS pruned (
    digest BLOB PRIMARY KEY, version BLOB NOT NULL, state TEXT NOT NULL, at REAL NOT NULL);
"""
_INDEXES = """
CREATE INDEX IF NOT EXISTS groups_by_version ON groups (version);
CREATE INDEX IF NOT EXISTS verdicts_by_version ON verdicts (version);
"""
# Version 1 kept these columns as INTEGER; everything else is copied as it is. Verdicts were
# indexed by the round their verifier claimed; version 2 indexes them by the policy version of
# the group they judge, which the protocol has matched against the group itself (a claimed
# round of 2^64 - 1 would otherwise be served in every backfill page forever).
_U64_COLUMNS = {"policies": ("version",), "groups": ("version",), "trained": ("version",),
                "reputation": ("round",)}


def u64(value: int) -> bytes:
    """A u64 as stored: 8 bytes, big-endian, so BLOB order is numeric order."""
    return value.to_bytes(8, "big")


def _from_u64(value: bytes) -> int:
    return int.from_bytes(value, "big")


def _verdict_version(data: bytes) -> bytes:
    return u64(SignedVerdict.from_bytes(data).policy_version)


_MAX_OFFSET = (1 << 63) - 1
# The meta key naming whose store this is (hex node id): an auditor replays reputation as that
# node's view, whose pre-trusted set includes the node itself (specs/audit.md §1). Not a schema
# change: a store without it is still read, and its folder's key names the owner instead.
OWNER_KEY = "node"
# The meta key holding when the reputation snapshot was computed (a float, time.time()).
SNAPSHOT_AT_KEY = "reputation_at"


# The tables a backfill cursor has a watermark for, in the order of kinds (specs/network.md §6),
# each with what a row must be to be served past ``since``.
_SERVED = (("policies", "version >= :since"), ("manifests", "round >= :since"),
           ("groups", "version >= :since AND planted = 0"), ("verdicts", "version >= :since"),
           ("steps", "version >= :since"))
assert len(_SERVED) == BACKFILL_CURSOR_TABLES
# What a server pages in the committee design (specs/network.md §3.5, §6): what that design
# gossips, and to the trainer what the server itself sent it. No group but the server's own (a
# member fetches its groups by digest; the trainer holds them, having served them), no pass but
# the server's own to the trainer (it concerns the trainer alone) and the trainer's on a group a
# failure names (its re-check, which clears the accusation in every view), no step pass.
# ``:trainer`` is the trainer's id, ``:sender`` the server's own to the trainer, else nobody's.
_GOSSIPED = {
    "groups": "subject = :sender",
    "verdicts": "(outcome != 'pass' OR verifier = :sender OR (verifier = :trainer AND grp IN"
                " (SELECT grp FROM verdicts WHERE outcome != 'pass')))",
    "steps": "outcome != 'pass'",
}
# An id no node has (ids are 32 bytes): ``:sender`` when the asker is not the trainer.
_NOBODY = b""


# What one backfill page may read of its store when the client names what it holds (``have``,
# specs/network.md §6): the page's own bytes are at most 1 MiB (BACKFILL_PAGE_BYTES), and the
# messages it leaves out are read to be hashed; 8 MiB is a page and seven pages' worth left
# out, so a request costs its server a bounded read however many rows the client holds.
BACKFILL_SCAN_BYTES = 8 << 20


class Page(NamedTuple):
    """A backfill page by cursor (:meth:`Store.page`)."""

    messages: list[bytes]
    cursor: tuple[int, ...]
    done: bool
    left_out: int  # rows past the cursor the client said it holds


class StoreError(VrlError):
    """The database cannot be opened or was written by an incompatible version."""


class Store:
    """One node's database. Safe to call from several threads (one connection, one lock)."""

    def __init__(self, path: str | Path) -> None:
        self.path = Path(path)
        self.path.parent.mkdir(parents=True, exist_ok=True)
        try:
            self._db = sqlite3.connect(self.path, isolation_level=None, check_same_thread=False)
            self._db.execute("PRAGMA journal_mode=WAL")
            self._db.execute("PRAGMA synchronous=FULL")
            self._db.execute("PRAGMA busy_timeout=5000")
            self._db.execute("CREATE TABLE IF NOT EXISTS meta (key TEXT PRIMARY KEY, value TEXT NOT NULL)")
            found = self._db.execute("SELECT value FROM meta WHERE key='schema'").fetchone()
            if found is None:
                self._db.executescript(_TABLES + _INDEXES)
                self._db.execute("INSERT INTO meta VALUES ('schema', ?)", (str(SCHEMA_VERSION),))
            elif found[0] in ("1", "2", "3", "4"):
                if found[0] == "1":
                    self._migrate_from_1()
                self._add_tables()  # 2 -> 3: steps; 3 -> 4: manifests; 4 -> 5: manifest_lists
            elif found[0] != str(SCHEMA_VERSION):
                raise StoreError(f"{self.path}: schema version {found[0]}, this node knows {SCHEMA_VERSION}")
            self._db.executescript(_PRUNED)
        except sqlite3.DatabaseError as error:
            raise StoreError(f"{self.path}: {error}") from error
        self._lock = threading.Lock()
        # What a backfill cursor's watermarks (rowids) are relative to (specs/network.md §6):
        # drawn at every open, since while the store was closed anything may have renumbered
        # or reused rowids (a VACUUM, a restored copy, a wiped data_dir). No row of a served table
        # is ever deleted while open; code that deletes one must draw a new generation. Nonzero,
        # so that a client's first cursor (all zeros) never matches.
        self.generation = 1 + secrets.randbelow((1 << 64) - 1)

    def _migrate_from_1(self) -> None:
        """Rewrite the u64 columns of a version 1 database as BLOBs: all or nothing."""
        self._db.create_function("u64", 1, u64, deterministic=True)
        self._db.execute("BEGIN IMMEDIATE")
        try:
            for table in ("verdicts", *_U64_COLUMNS):
                self._db.execute(f"ALTER TABLE {table} RENAME TO old_{table}")  # noqa: S608 (fixed names)
            self._db.execute("DROP INDEX IF EXISTS groups_by_version")
            self._db.execute("DROP INDEX IF EXISTS verdicts_by_round")
            for statement in (_TABLES + _INDEXES).split(";"):
                if statement.strip():
                    self._db.execute(statement)
            for table, converted in _U64_COLUMNS.items():
                columns = [row[1] for row in self._db.execute(f"PRAGMA table_info(old_{table})")]
                select = ", ".join(f"u64({c})" if c in converted else c for c in columns)
                self._db.execute(f"INSERT INTO {table} ({', '.join(columns)}) SELECT {select} FROM old_{table}")
            self._db.create_function("verdict_version", 1, _verdict_version, deterministic=True)
            self._db.execute("INSERT INTO verdicts SELECT id, grp, verifier, subject, verdict_version(data), outcome,"
                             " data, received FROM old_verdicts")
            for table in ("verdicts", *_U64_COLUMNS):
                self._db.execute(f"DROP TABLE old_{table}")
            self._db.execute("UPDATE meta SET value=? WHERE key='schema'", (str(SCHEMA_VERSION),))
            self._db.execute("COMMIT")
        except BaseException:
            self._rollback()
            raise

    def _add_tables(self) -> None:
        """Create the tables a newer schema added and record the new schema number, in one
        transaction: a crash leaves the old schema (and the next open migrates again) or the new."""
        self._db.execute("BEGIN IMMEDIATE")
        try:
            for statement in (_TABLES + _INDEXES).split(";"):
                if statement.strip():
                    self._db.execute(statement)
            self._db.execute("UPDATE meta SET value=? WHERE key='schema'", (str(SCHEMA_VERSION),))
            self._db.execute("COMMIT")
        except BaseException:
            self._rollback()
            raise

    def _rollback(self) -> None:
        """Roll back the open transaction, if SQLite has not already: on SQLITE_FULL (a full
        disk) it rolls back by itself, and a ROLLBACK then would raise over the real error."""
        if self._db.in_transaction:
            self._db.execute("ROLLBACK")

    def close(self) -> None:
        with self._lock:
            self._db.close()

    def claim(self, node_id: bytes) -> None:
        """Record whose store this is, once (:data:`OWNER_KEY`); a store is one node's for life."""
        with self._lock:
            found = self._db.execute("SELECT value FROM meta WHERE key=?", (OWNER_KEY,)).fetchone()
            if found is not None and found[0] != node_id.hex():
                raise StoreError(f"{self.path}: this store belongs to node {found[0][:16]}…, not "
                                 f"{node_id.hex()[:16]}…: give each node a data_dir of its own")
            self._db.execute("INSERT OR IGNORE INTO meta VALUES (?, ?)", (OWNER_KEY, node_id.hex()))

    def _write(self, sql: str, params: tuple[object, ...]) -> bool:
        """One committed statement; False when it inserted nothing (already known)."""
        with self._lock:
            cursor = self._db.execute(sql, params)
            return cursor.rowcount > 0

    def _write_all(self, statements: list[tuple[str, tuple[object, ...]]]) -> bool:
        """Statements in one transaction; False when the first inserted nothing."""
        with self._lock:
            self._db.execute("BEGIN IMMEDIATE")
            try:
                first = self._db.execute(*statements[0]).rowcount > 0
                for statement in statements[1:]:
                    self._db.execute(*statement)
                self._db.execute("COMMIT")
            except BaseException:
                self._rollback()
                raise
            return first

    # -- writes (each is one transaction) ----------------------------------------------------
    def put_policy(self, announcement: PolicyAnnouncement, received: float) -> bool:
        return self._write("INSERT OR IGNORE INTO policies VALUES (?, ?, ?, ?, ?, ?)", (
            u64(announcement.version), announcement.model_hash, announcement.blob, announcement.size,
            announcement.to_bytes(), received))

    def put_group(self, submission: Submission, subject: bytes, version: int, received: float,
                  planted: bool = False) -> bool:
        return self._write("INSERT OR IGNORE INTO groups VALUES (?, ?, ?, ?, ?, ?)", (
            submission.digest, subject, u64(version), submission.to_bytes(), received, int(planted)))

    def put_verdict(self, verdict: SignedVerdict, received: float) -> bool:
        # One row per (group, verifier); a check replaces the verifier's own skip, never the
        # reverse (specs/network.md §3.2). The replacement takes the next rowid, past every
        # backfill cursor's watermark (Store.page), so that peers that paged the skip get the check.
        return self._write("INSERT INTO verdicts VALUES (?, ?, ?, ?, ?, ?, ?, ?)"
                           " ON CONFLICT (grp, verifier) DO UPDATE SET rowid=(SELECT max(rowid) + 1 FROM verdicts),"
                           " id=excluded.id, outcome=excluded.outcome,"
                           " data=excluded.data, received=excluded.received"
                           " WHERE verdicts.outcome = 'skipped' AND excluded.outcome != 'skipped'", (
            verdict.id, verdict.group, verdict.verifier, verdict.subject, u64(verdict.policy_version), verdict.outcome,
            verdict.to_bytes(), received))

    def put_step(self, verdict: StepVerdict, received: float) -> bool:
        # One step verdict per (version, verifier), never replaced: a step is judged once.
        return self._write("INSERT OR IGNORE INTO steps VALUES (?, ?, ?, ?, ?, ?)", (
            verdict.id, u64(verdict.version), verdict.verifier, verdict.outcome, verdict.to_bytes(), received))

    def put_manifest(self, manifest: RoundManifest, received: float, lists: ManifestLists | None = None) -> bool:
        # One manifest per round, never replaced: the first accepted is the one every committee
        # of the round is drawn from (specs/committee.md §3.3). The trainer's lists behind it in
        # the same transaction: a crash leaves both or neither.
        statements: list[tuple[str, tuple[object, ...]]] = [("INSERT OR IGNORE INTO manifests VALUES (?, ?, ?, ?)",
                       (u64(manifest.round), manifest.trainer, manifest.to_bytes(), received))]
        if lists is not None:
            statements.append(("INSERT OR IGNORE INTO manifest_lists VALUES (?, ?)",
                               (u64(manifest.round), lists.to_bytes())))
        return self._write_all(statements)

    def put_trained(self, version: int, groups: tuple[bytes, ...], metrics_json: str) -> bool:
        return self._write("INSERT OR IGNORE INTO trained VALUES (?, ?, ?)",
                           (u64(version), b"".join(groups), metrics_json))

    def put_reputation(self, version: int, rows: list[tuple[bytes, float, float, bool, float, int]],
                       at: float | None = None) -> None:
        """Replace the snapshot with ``rows``, as of round ``version``, computed at ``at``
        (the clock the ``received`` columns use): an auditor replays the verdicts received by
        then and must get these rows (specs/audit.md §3, ``reputation``)."""
        with self._lock:
            self._db.execute("BEGIN IMMEDIATE")
            try:
                self._db.execute("DELETE FROM reputation")
                if at is not None:
                    self._db.execute("INSERT OR REPLACE INTO meta VALUES (?, ?)", (SNAPSHOT_AT_KEY, repr(at)))
                else:  # a snapshot of unknown time: no earlier time may be taken for it
                    self._db.execute("DELETE FROM meta WHERE key=?", (SNAPSHOT_AT_KEY,))
                self._db.executemany("INSERT INTO reputation VALUES (?, ?, ?, ?, ?, ?, ?)", [
                    (node, u64(version), score, rate, int(q), trust, checked)
                    for node, score, rate, q, trust, checked in rows])
                self._db.execute("COMMIT")
            except BaseException:
                self._rollback()
                raise

    # -- the prune journal (vrl.node.storage.Pruner) ------------------------------------------
    def begin_prune(self, blobs: list[tuple[bytes, int]], at: float) -> None:
        """Record the intent to remove ``blobs`` (digest, newest version naming it): one
        transaction, committed before any file goes."""
        with self._lock:
            self._db.execute("BEGIN IMMEDIATE")
            try:
                self._db.executemany("INSERT OR REPLACE INTO pruned VALUES (?, ?, 'intent', ?)",
                                     [(digest, u64(version), at) for digest, version in blobs])
                self._db.execute("COMMIT")
            except BaseException:
                self._rollback()
                raise

    def end_prune(self, digests: list[bytes]) -> None:
        """The blobs are gone (unlinked, directory synced)."""
        with self._lock:
            self._db.executemany("UPDATE pruned SET state='done' WHERE digest=?", [(d,) for d in digests])

    def cancel_prune(self, digests: list[bytes]) -> None:
        """The intents to remove these blobs are dropped: the files stay."""
        with self._lock:
            self._db.executemany("DELETE FROM pruned WHERE digest=? AND state='intent'", [(d,) for d in digests])

    def prune_intents(self) -> list[bytes]:
        return [d for (d,) in self._rows("SELECT digest FROM pruned WHERE state='intent' ORDER BY digest")]

    def pruned(self) -> dict[bytes, tuple[int, str]]:
        """Every blob in the journal: digest -> (newest version naming it, 'intent' or 'done')."""
        return {d: (_from_u64(v), state) for d, v, state in self._rows("SELECT digest, version, state FROM pruned")}

    # -- reads -------------------------------------------------------------------------------
    def _rows(self, sql: str, params: tuple[object, ...] = ()) -> list[tuple[Any, ...]]:
        with self._lock:
            return self._db.execute(sql, params).fetchall()

    def has(self, topic: str, data: bytes) -> bool:
        """Whether this exact gossip message is already stored (by its content address)."""
        if topic == TOPIC_GROUPS:
            try:
                key = Submission.from_bytes(data).digest
            except MessageError:
                return False
            return bool(self._rows("SELECT 1 FROM groups WHERE digest=?", (key,)))
        if topic == TOPIC_VERDICTS:
            return bool(self._rows("SELECT 1 FROM verdicts WHERE id=?", (hashlib.sha256(data).digest(),)))
        if topic == TOPIC_STEPS:
            return bool(self._rows("SELECT 1 FROM steps WHERE id=?", (hashlib.sha256(data).digest(),)))
        if topic == TOPIC_MANIFESTS:
            return bool(self._rows("SELECT 1 FROM manifests WHERE data=?", (data,)))
        return bool(self._rows("SELECT 1 FROM policies WHERE data=?", (data,)))

    def manifests(self) -> list[RoundManifest]:
        """Every stored round manifest, by round."""
        return [RoundManifest.from_bytes(data) for (data,) in self._rows("SELECT data FROM manifests ORDER BY round")]

    def manifest_lists(self) -> dict[int, ManifestLists]:
        """The lists behind the stored manifests that this node holds (the trainer's), by round."""
        return {_from_u64(r): ManifestLists.from_bytes(data)
                for r, data in self._rows("SELECT round, data FROM manifest_lists ORDER BY round")}

    def group(self, digest: bytes) -> Submission | None:
        rows = self._rows("SELECT data FROM groups WHERE digest=?", (digest,))
        return Submission.from_bytes(rows[0][0]) if rows else None

    def policy(self, version: int) -> PolicyAnnouncement | None:
        rows = self._rows("SELECT data FROM policies WHERE version=?", (u64(version),))
        return PolicyAnnouncement.from_bytes(rows[0][0]) if rows else None

    def counts(self) -> dict[str, int]:
        return {table: self._rows(f"SELECT count(*) FROM {table}")[0][0]  # noqa: S608 (fixed names)
                for table in ("policies", "manifests", "groups", "verdicts", "steps", "trained")}

    def trained_versions(self) -> list[tuple[int, tuple[bytes, ...], str]]:
        return [(_from_u64(v), tuple(g[i:i + 32] for i in range(0, len(g), 32)), m)
                for v, g, m in self._rows("SELECT version, groups, metrics FROM trained ORDER BY version")]

    def reputation(self) -> list[tuple[Any, ...]]:
        return [(node, _from_u64(r), *rest) for node, r, *rest in self._rows(
            "SELECT node, round, score, check_rate, quarantined, trust, checked_groups "
            "FROM reputation ORDER BY score DESC, node")]

    def replay(self) -> Iterator[tuple[str, bytes, tuple[Any, ...]]]:
        """Everything stored, as ``(kind, data, extra)``: policies by version (extra: received),
        then round manifests by round (extra: received, and the lists behind it or None), then
        groups by arrival (extra: subject, version, received, planted), then verdicts, then step
        verdicts, then training steps.
        Manifests come before groups and verdicts: in the committee design a group of a closed
        round counts only if listed, and a verdict's claim is checked against its manifest."""
        for data, received in self._rows("SELECT data, received FROM policies ORDER BY version"):
            yield "policy", data, (received,)
        for data, received, lists in self._rows(
                "SELECT m.data, m.received, l.data FROM manifests m LEFT JOIN manifest_lists l ON l.round = m.round"
                " ORDER BY m.round"):
            yield "manifest", data, (received, lists)
        for data, subject, version, received, planted in self._rows(
                "SELECT data, subject, version, received, planted FROM groups ORDER BY received, digest"):
            yield "group", data, (subject, _from_u64(version), received, bool(planted))
        for (data,) in self._rows("SELECT data FROM verdicts ORDER BY received, id"):
            yield "verdict", data, ()
        for (data,) in self._rows("SELECT data FROM steps ORDER BY received, id"):
            yield "step", data, ()
        for version, groups, _ in self.trained_versions():
            yield "trained", b"", (version, groups)

    def since(self, version: int, limit_bytes: int, after: int = 0,
              limit_messages: int = BACKFILL_MAX_MESSAGES, trainer: bytes | None = None,
              sender: bytes = _NOBODY) -> tuple[list[bytes], int | None]:
        """Gossip messages of versions >= ``version`` for a peer catching up (backfill):
        policies, round manifests, groups, verdicts and step verdicts in a stable order (a
        manifest before the groups and verdicts its round's claims are checked against), at most ``limit_bytes`` and
        ``limit_messages`` of them from position ``after``; returns them and the next position,
        or None at the end.

        ``version`` and ``after`` are u64 from a peer's request: the version compares as a
        BLOB; an offset past SQLite's signed range skips everything, as any past the end does.
        Only the keys are sorted; each message's bytes are read once it is known to fit, so a
        request costs one page's bytes in memory, however large the store. ``trainer`` and
        ``sender``: as :meth:`page`'s."""
        tables = ("policies", "manifests", "groups", "verdicts", "steps")

        def only(table: str) -> str:
            return f" AND {_GOSSIPED[table]}" if trainer is not None and table in _GOSSIPED else ""

        with self._lock:
            keys = self._db.execute(
                "SELECT k, r FROM (SELECT 0 AS k, version AS o, blob AS t, rowid AS r FROM policies"
                " WHERE version >= :since"
                " UNION ALL SELECT 1, round, trainer, rowid FROM manifests WHERE round >= :since"
                " UNION ALL SELECT 2, version, digest, rowid FROM groups WHERE version >= :since AND planted = 0"
                f"{only('groups')}"
                f" UNION ALL SELECT 3, version, id, rowid FROM verdicts WHERE version >= :since{only('verdicts')}"
                f" UNION ALL SELECT 4, version, id, rowid FROM steps WHERE version >= :since{only('steps')})"
                " ORDER BY k, o, t LIMIT :limit OFFSET :offset",  # noqa: S608
                {"since": u64(version), "limit": limit_messages + 1, "offset": min(after, _MAX_OFFSET),
                 "trainer": trainer, "sender": sender}).fetchall()
            out: list[bytes] = []
            size = 0
            for kind, row in keys:
                (data,), = self._db.execute(f"SELECT data FROM {tables[kind]} WHERE rowid=?", (row,))  # noqa: S608
                if out and (size + len(data) > limit_bytes or len(out) == limit_messages):
                    return out, after + len(out)
                out.append(data)
                size += len(data)
        return out, None

    def marks(self) -> tuple[int, ...]:
        """The largest rowid of each table of :data:`_SERVED`: where :meth:`held_since` starts next."""
        with self._lock:
            return self._tops()

    def _tops(self) -> tuple[int, ...]:  # (the lock held)
        return tuple(self._db.execute(f"SELECT coalesce(max(rowid), 0) FROM {table}").fetchone()[0]  # noqa: S608
                     for table, _ in _SERVED)

    def held_since(self, version: int, marks: tuple[int, ...] | None, salt: bytes,
                   limit: int = BACKFILL_HAVE_MAX) -> tuple[bytes, tuple[int, ...]]:
        """What a backfill client names before the bodies cross (``have``, specs/network.md §6):
        ``salt`` and the short ids of the messages of versions >= ``version`` this store took
        past ``marks`` (one rowid per table of :data:`_SERVED`; None: all of them), at most
        ``limit`` (the first kinds first, the newest first within one); and the marks now. Empty
        bytes when it took none. Memory: the ids and one row at a time; time: those rows, read
        and hashed once each."""
        tops = self.marks()
        start = marks if marks is not None and len(marks) == len(_SERVED) else (0,) * len(_SERVED)
        ids: list[bytes] = []
        with self._lock:
            for (table, served), mark, top in zip(_SERVED, start, tops, strict=True):
                if len(ids) == limit:
                    break
                rows = self._db.execute(
                    f"SELECT data FROM {table} WHERE rowid > :mark AND rowid <= :top AND {served}"  # noqa: S608
                    " ORDER BY rowid DESC LIMIT :limit",
                    {"mark": mark, "top": top, "since": u64(version), "limit": limit - len(ids)})
                ids += [short_id(salt, data) for (data,) in rows]  # streamed: a row at a time
        return (salt + b"".join(ids) if ids else b""), tops

    def page(self, version: int, cursor: tuple[int, ...], limit_bytes: int,
             limit_messages: int = BACKFILL_MAX_MESSAGES, held: frozenset[bytes] = frozenset(),
             salt: bytes = b"", trainer: bytes | None = None, sender: bytes = _NOBODY) -> Page:
        """A backfill page by cursor (specs/network.md §6): the messages of versions >=
        ``version`` stored past ``cursor`` (``[generation, w_1 .. w_5]``, one rowid
        watermark per table of :data:`_SERVED`), table by table in the order of kinds, each in
        rowid (append) order, at most ``limit_bytes`` and ``limit_messages`` of them, less those
        whose short id under ``salt`` is in ``held`` (the client holds them: the request's
        ``have``); returns them, the cursor to ask with next, whether the page reached the end,
        and how many it left out. ``trainer``: the trainer's id in a committee-design network,
        where only what that design gossips is served, and, to the trainer, what ``sender`` (this
        store's node, given when the asker is the trainer) sent it (:data:`_GOSSIPED`).

        A cursor of another generation, or with a watermark above its table's largest rowid (the
        store was reset, or the cursor is not one of ours), is a full pass: every watermark 0. A
        table the page got past takes its largest rowid as watermark (its rows not served were
        of older versions or planted: never served for this ``version`` or a larger one, or
        held by the client). Memory and time: one page's bytes, as :meth:`since`; with ``held``,
        at most ``limit_messages`` rows and BACKFILL_SCAN_BYTES read, each hashed once."""
        out: list[bytes] = []
        size = read = scanned = 0
        with self._lock:
            tops = self._tops()
            marks = list(cursor[1:])
            if cursor[0] != self.generation or any(m > top for m, top in zip(marks, tops, strict=True)):
                marks = [0] * len(_SERVED)
            for index, (table, served) in enumerate(_SERVED):
                if trainer is not None and table in _GOSSIPED:
                    served = f"{served} AND {_GOSSIPED[table]}"
                rows = self._db.execute(
                    f"SELECT rowid, length(data) FROM {table} WHERE rowid > :mark AND {served}"  # noqa: S608
                    " ORDER BY rowid LIMIT :limit", {"mark": marks[index], "limit": limit_messages - scanned + 1,
                                                     "since": u64(version), "trainer": trainer, "sender": sender})
                for row, length in rows.fetchall():
                    if scanned and (size + length > limit_bytes or read + length > BACKFILL_SCAN_BYTES
                                    or scanned == limit_messages):
                        return Page(out, (self.generation, *marks), False, scanned - len(out))
                    (data,), = self._db.execute(f"SELECT data FROM {table} WHERE rowid=?", (row,))  # noqa: S608
                    scanned += 1
                    marks[index] = row
                    if held:
                        read += length
                        if short_id(salt, data) in held:
                            continue
                    out.append(data)
                    size += length
                marks[index] = tops[index]
        return Page(out, (self.generation, *marks), True, scanned - len(out))
