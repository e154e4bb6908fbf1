"""What an audit reads (specs/audit.md §1): node stores, opened read-only, the node folders
around them (node.toml, the blobs), devnet folders of node folders, and rollout files.

Nothing here writes into an input. A store whose write-ahead log is empty (a node that shut
down cleanly) is opened with SQLite's ``immutable`` flag: no lock, no journal, no ``-shm``
file. A store with a non-empty ``-wal`` (a node still running, or killed) needs that log
replayed, which SQLite does by writing an index beside it; such a store is copied (database
and log) into a temporary folder first, and the copy is opened. Rows are streamed from
cursors: an audit holds one message's bytes at a time, whatever the length of the log.
"""

from __future__ import annotations

import math
import shutil
import sqlite3
import tempfile
from collections.abc import Iterator
from dataclasses import dataclass, field
from pathlib import Path
from urllib.parse import quote

from vrl.errors import VrlError
from vrl.node.config import NodeConfig
from vrl.node.store import OWNER_KEY, SCHEMA_VERSION, SNAPSHOT_AT_KEY
from vrl.rollouts.keys import KeyFileError, NodeKey

STORE_FILE = "node.sqlite"
CONFIG_FILE = "node.toml"
BLOB_DIR = "blobs"
ROLLOUT_SUFFIXES = (".vrl", ".msgpack")
# The tables an audit reads, with the columns it reads: a store without them is not a node store.
_EXPECTED = {"policies": {"version", "data", "received"}, "groups": {"digest", "subject", "version", "data",
                                                                     "received", "planted"},
             "verdicts": {"grp", "verifier", "data", "received"}, "steps": {"data", "received"},
             "trained": {"version", "groups", "metrics"}, "reputation": {"node", "round", "score", "quarantined"}}


class AuditError(VrlError):
    """An input the audit cannot use at all (``vrl audit`` exits 2): not a store, a store of
    another schema, a path that is none of the inputs an audit takes. The message names the file."""


def _u64(value: bytes) -> int:
    return int.from_bytes(value, "big")


class StoreReader:
    """One node's store, read-only, streamed. Every read yields raw rows; decoding (and what
    a row that does not decode means) is the checks' business."""

    def __init__(self, path: Path) -> None:
        self.path = path
        self.damaged: list[tuple[str, int]] = []  # (table, rowid) of rows of the wrong types, skipped
        self._copy: Path | None = None
        wal = path.with_name(path.name + "-wal")
        try:
            if wal.exists() and wal.stat().st_size > 0:
                self._copy = Path(tempfile.mkdtemp(prefix="vrl-audit-"))
                shutil.copy2(path, self._copy / path.name)
                shutil.copy2(wal, self._copy / wal.name)
                self._db = sqlite3.connect(f"file:{quote(str(self._copy / path.name))}?mode=ro", uri=True)
            else:
                self._db = sqlite3.connect(f"file:{quote(str(path))}?mode=ro&immutable=1", uri=True)
            self._check_schema()
        except sqlite3.DatabaseError as error:
            self.close()
            raise AuditError(f"{path}: not a vrl node store ({error})") from None
        except OSError as error:
            self.close()
            raise AuditError(f"{path}: cannot be read ({error.strerror or error})") from None

    def _check_schema(self) -> None:
        tables = {row[0] for row in self._db.execute("SELECT name FROM sqlite_master WHERE type='table'")}
        if "meta" not in tables:
            raise AuditError(f"{self.path}: not a vrl node store (no meta table)")
        found = self._db.execute("SELECT value FROM meta WHERE key='schema'").fetchone()
        if found is None or found[0] != str(SCHEMA_VERSION):
            raise AuditError(f"{self.path}: store schema version {found[0] if found else 'missing'}; this audit "
                             f"reads version {SCHEMA_VERSION} (a node of this vrl migrates older stores when it "
                             f"starts: audit a copy it has opened)")
        for table, columns in _EXPECTED.items():
            have = {row[1] for row in self._db.execute(f"PRAGMA table_info({table})")}  # noqa: S608 (fixed names)
            if not columns <= have:
                raise AuditError(f"{self.path}: table {table!r} lacks columns {sorted(columns - have)}")

    def close(self) -> None:
        db = getattr(self, "_db", None)
        if db is not None:
            db.close()
            self._db = None
        if self._copy is not None:
            shutil.rmtree(self._copy, ignore_errors=True)
            self._copy = None

    def _stream(self, sql: str, params: tuple = (), types: tuple = ()) -> Iterator[tuple]:
        """Rows whose columns have ``types`` (bytes of a given length as ``(bytes, n)``); any
        other row is noted in :attr:`damaged` (table and rowid) and skipped."""
        table = sql.split(" FROM ")[1].split()[0]
        try:
            for row in self._db.execute(sql, params):
                if all(_fits(value, kind) for value, kind in zip(row[1:], types)):
                    yield row[1:]
                else:
                    self.damaged.append((table, row[0]))
        except sqlite3.DatabaseError as error:
            raise AuditError(f"{self.path}: damaged while reading ({error})") from None

    # -- what the store says about itself --------------------------------------------------------
    def owner(self) -> bytes | None:
        """The node whose store this is, if its node recorded it (vrl.node.store.OWNER_KEY)."""
        row = self._db.execute("SELECT value FROM meta WHERE key=?", (OWNER_KEY,)).fetchone()
        try:
            return bytes.fromhex(row[0]) if row else None
        except ValueError:
            return None

    def snapshot_at(self) -> float | None:
        """When the node computed its reputation snapshot (vrl.node.store.SNAPSHOT_AT_KEY)."""
        row = self._db.execute("SELECT value FROM meta WHERE key=?", (SNAPSHOT_AT_KEY,)).fetchone()
        try:
            return float(row[0]) if row else None
        except ValueError:
            return None

    def counts(self) -> dict[str, int]:
        return {table: self._db.execute(f"SELECT count(*) FROM {table}").fetchone()[0]  # noqa: S608
                for table in ("policies", "groups", "verdicts", "steps", "trained")}

    # -- the log, streamed ------------------------------------------------------------------------
    def policies(self) -> Iterator[tuple[bytes, float]]:
        """``(data, received)`` by version."""
        yield from self._stream("SELECT rowid, data, received FROM policies ORDER BY version", (), (bytes, float))

    def group_headers(self) -> Iterator[tuple[bytes, bytes, int, float, bool]]:
        """``(digest, subject, version, received, planted)`` by arrival, without the records."""
        for digest, subject, version, received, planted in self._stream(
                "SELECT rowid, digest, subject, version, received, planted FROM groups ORDER BY received, digest", (),
                ((bytes, 32), bytes, (bytes, 8), float, int)):
            yield digest, subject, _u64(version), received, bool(planted)

    def groups(self) -> Iterator[tuple[bytes, bytes, bytes, int, bool]]:
        """``(digest, data, subject, version, planted)`` by arrival, one group's bytes at a time."""
        for digest, data, subject, version, planted in self._stream(
                "SELECT rowid, digest, data, subject, version, planted FROM groups ORDER BY received, digest", (),
                ((bytes, 32), bytes, bytes, (bytes, 8), int)):
            yield digest, data, subject, _u64(version), bool(planted)

    def group(self, digest: bytes) -> bytes | None:
        row = self._db.execute("SELECT data FROM groups WHERE digest=?", (digest,)).fetchone()
        return row[0] if row and isinstance(row[0], bytes) else None

    def verdicts(self) -> Iterator[tuple[bytes, float]]:
        """``(data, received)`` in the order they were received."""
        yield from self._stream("SELECT rowid, data, received FROM verdicts ORDER BY received, id", (), (bytes, float))

    def steps(self) -> Iterator[tuple[bytes, float]]:
        yield from self._stream("SELECT rowid, data, received FROM steps ORDER BY received, id", (), (bytes, float))

    def trained(self) -> Iterator[tuple[int, tuple[bytes, ...], str]]:
        """``(version, group digests, metrics JSON)``: what the trainer recorded for each version."""
        for version, groups, metrics in self._stream("SELECT rowid, version, groups, metrics FROM trained "
                                                     "ORDER BY version", (), ((bytes, 8), bytes, str)):
            if len(groups) % 32 == 0:
                yield _u64(version), tuple(groups[i:i + 32] for i in range(0, len(groups), 32)), metrics

    def snapshot(self) -> list[tuple[bytes, int, float, bool]]:
        """The reputation table the node last wrote: ``(node, round, score, quarantined)``."""
        return [(node, _u64(r), score, bool(q)) for node, r, score, q in self._stream(
            "SELECT rowid, node, round, score, quarantined FROM reputation ORDER BY node", (),
            ((bytes, 32), (bytes, 8), float, int))]


def _fits(value: object, kind: type | tuple[type, int]) -> bool:
    """Whether a column's value is what the node writes there: an int is a float column's
    value too (SQLite keeps 1.0 as 1); received times and scores must be finite."""
    if isinstance(kind, tuple):
        return isinstance(value, kind[0]) and len(value) == kind[1]
    if kind is float:
        return isinstance(value, (int, float)) and not isinstance(value, bool) and math.isfinite(value)
    return isinstance(value, kind)


@dataclass
class NodeInput:
    """One node's part of a run: its store, and what its folder says (config, blobs, key)."""

    name: str
    store: StoreReader
    config: NodeConfig | None = None
    blob_dir: Path | None = None
    key_id: bytes | None = None  # the public id of the folder's node.pem, when there is one

    @property
    def owner(self) -> bytes | None:
        """Whose view the store is: what the store says, else the folder's key."""
        return self.store.owner() or self.key_id


@dataclass
class Inputs:
    """Everything one audit reads."""

    nodes: list[NodeInput] = field(default_factory=list)
    rollout_files: list[Path] = field(default_factory=list)

    def close(self) -> None:
        for node in self.nodes:
            node.store.close()

    def blob(self, digest: bytes) -> bytes | None:
        """A blob by its SHA-256 from any node folder; the caller hashes it again."""
        for node in self.nodes:
            if node.blob_dir is not None:
                path = node.blob_dir / digest.hex()
                try:
                    return path.read_bytes()
                except OSError:
                    continue
        return None


def _node_folder(folder: Path, name: str) -> NodeInput:
    config = None
    if (folder / CONFIG_FILE).is_file():
        from vrl.config import ConfigError

        try:
            config = NodeConfig.from_toml(folder / CONFIG_FILE)
        except ConfigError as error:
            raise AuditError(str(error)) from None
    key_id = None
    key_path = (config.path / config.key) if config is not None else folder / "node.pem"
    if key_path.is_file():
        try:
            key_id = NodeKey.load(key_path).node_id
        except KeyFileError:
            key_id = None  # the store's own record of its owner, or no reputation comparison
    blob_dir = folder / BLOB_DIR
    return NodeInput(name, StoreReader(folder / STORE_FILE), config, blob_dir if blob_dir.is_dir() else None, key_id)


def open_inputs(paths: list[Path]) -> Inputs:
    """Sort ``paths`` into stores and rollout files: a devnet folder (``node-*/`` folders), a
    node folder (with ``node.sqlite``), a ``.sqlite`` store, or a rollout file. Raises
    :class:`AuditError` naming the first path that is none of them."""
    if not paths:
        raise AuditError("nothing to audit: give a devnet folder, node folders, node stores or rollout files")
    inputs = Inputs()
    try:
        for path in paths:
            path = Path(path)
            if not path.exists():
                raise AuditError(f"{path}: no such file or folder")
            if path.is_dir():
                nodes = sorted((p for p in path.glob("node-*") if (p / STORE_FILE).is_file()),
                               key=lambda p: (len(p.name), p.name))
                if (path / STORE_FILE).is_file():
                    inputs.nodes.append(_node_folder(path, path.name))
                elif nodes:
                    inputs.nodes += [_node_folder(p, p.name) for p in nodes]
                else:
                    raise AuditError(f"{path}: neither a devnet folder (node-*/{STORE_FILE}) nor a node folder "
                                     f"({STORE_FILE})")
            elif path.suffix in ROLLOUT_SUFFIXES:
                inputs.rollout_files.append(path)
            else:
                folder = path.parent
                if (folder / CONFIG_FILE).is_file() and path.name == STORE_FILE:
                    inputs.nodes.append(_node_folder(folder, folder.name))
                else:
                    inputs.nodes.append(NodeInput(path.name, StoreReader(path)))
    except BaseException:
        inputs.close()
        raise
    names = [n.name for n in inputs.nodes]
    for i, node in enumerate(inputs.nodes):  # two folders named node-1 from two devnets stay apart
        if names.count(node.name) > 1:
            node.name = f"{node.name}#{i}"
    return inputs
