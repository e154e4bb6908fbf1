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

import hashlib
import math
import shutil
import sqlite3
import stat
import tempfile
from collections.abc import Iterator, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import TYPE_CHECKING, Any
from urllib.parse import quote

from vrl.errors import VrlError
from vrl.node.config import NodeConfig
from vrl.node.store import OWNER_KEY, SCHEMA_VERSION, SNAPSHOT_AT_KEY
from vrl.rollouts.files import FILE_MAGIC
from vrl.rollouts.keys import KeyFileError, NodeKey

if TYPE_CHECKING:
    from vrl.rl.export import TrainedPolicy

STORE_FILE = "node.sqlite"
CONFIG_FILE = "node.toml"
BLOB_DIR = "blobs"
ROLLOUT_SUFFIXES = (".vrl", ".msgpack")
CLAIM_SUFFIX = ".claim.json"  # what vrl evaluate writes beside a claim's records
# The largest blob an audit reads: a node's own bound on what it fetches (vrl.node.daemon:
# MAX_OPTIMIZER_BYTES, two moments of a MAX_WEIGHTS_BYTES model and a margin), so any file a
# node could have stored is read, and a hand-made 1 TB "blob" is not.
MAX_BLOB_BYTES = (4 << 30) + (64 << 20)
# The tables an audit reads, with the columns it reads: a store without them is not a node store.
_EXPECTED = {"policies": {"version", "data", "received"}, "groups": {"digest", "subject", "version", "data",
                                                                     "received", "planted"},
             "verdicts": {"grp", "verifier", "data", "received"}, "steps": {"data", "received"},
             "trained": {"version", "groups", "metrics"}, "reputation": {"node", "round", "score", "quarantined"},
             "manifests": {"round", "data", "received"}}


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
        # A view under a table's name would be queried like one, and a recursive one never ends.
        missing = sorted(set(_EXPECTED) - tables)
        if missing:
            raise AuditError(f"{self.path}: not a vrl node store (no table {missing[0]!r})")
        for table, columns in _EXPECTED.items():
            have = {row[1] for row in self._db.execute(f"PRAGMA table_info({table})")}  # noqa: S608 (fixed names)
            if not columns <= have:
                raise AuditError(f"{self.path}: table {table!r} lacks columns {sorted(columns - have)}")

    def close(self) -> None:
        db: sqlite3.Connection | None = self.__dict__.pop("_db", None)  # absent: never opened, or closed
        if db is not None:
            db.close()
        if self._copy is not None:
            shutil.rmtree(self._copy, ignore_errors=True)
            self._copy = None

    def _stream(self, table: str, columns: str, order: str, types: tuple[_Kind, ...]) -> Iterator[tuple[Any, ...]]:
        """``columns`` of every row of ``table`` in ``order``, one row at a time: the order is
        taken over the row ids alone (sorting whole rows would copy every message's bytes into
        a temporary B-tree), then each row is read by its id. A row whose columns do not have
        ``types`` (bytes of a given length as ``(bytes, n)``) is noted in :attr:`damaged` and
        skipped."""
        try:
            rowids = [row[0] for row in self._db.execute(f"SELECT rowid FROM {table} ORDER BY {order}")]  # noqa: S608
            for rowid in rowids:
                row = self._db.execute(f"SELECT {columns} FROM {table} WHERE rowid=?", (rowid,)).fetchone()  # noqa: S608
                if row is None:
                    continue
                if all(_fits(value, kind) for value, kind in zip(row, types)):
                    yield row
                else:
                    self.damaged.append((table, rowid))
        except sqlite3.DatabaseError as error:
            raise AuditError(f"{self.path}: damaged while reading ({error})") from None

    # -- what the store says about itself --------------------------------------------------------
    def owner(self) -> bytes | None:
        """The node whose store this is, if its node recorded it (vrl.node.store.OWNER_KEY)."""
        row = self._db.execute("SELECT value FROM meta WHERE key=?", (OWNER_KEY,)).fetchone()
        try:
            owner = bytes.fromhex(row[0]) if row and isinstance(row[0], str) else None
        except ValueError:
            return None
        return owner if owner is not None and len(owner) == 32 else None

    def snapshot_at(self) -> float | None:
        """When the node computed its reputation snapshot (vrl.node.store.SNAPSHOT_AT_KEY)."""
        row = self._db.execute("SELECT value FROM meta WHERE key=?", (SNAPSHOT_AT_KEY,)).fetchone()
        try:
            at = float(row[0]) if row and isinstance(row[0], (str, int, float)) else None
        except ValueError:
            return None
        return at if at is not None and math.isfinite(at) else None

    def counts(self) -> dict[str, int]:
        return {table: self._db.execute(f"SELECT count(*) FROM {table}").fetchone()[0]  # noqa: S608
                for table in ("policies", "manifests", "groups", "verdicts", "steps", "trained")}

    # -- the log, streamed ------------------------------------------------------------------------
    def policies(self) -> Iterator[tuple[int, bytes, float]]:
        """``(version column, data, received)`` by version."""
        for version, data, received in self._stream("policies", "version, data, received", "version",
                                                     ((bytes, 8), bytes, float)):
            yield _u64(version), data, received

    def manifests(self) -> Iterator[tuple[int, bytes, float]]:
        """``(round column, data, received)`` of the round manifests (specs/committee.md §3.3), by round."""
        for version, data, received in self._stream("manifests", "round, data, received", "round",
                                                   ((bytes, 8), bytes, float)):
            yield _u64(version), data, received

    def manifest_lists(self) -> Iterator[tuple[int, bytes]]:
        """``(round column, data)`` of the lists behind the round manifests the trainer signed
        (specs/committee.md §3.1; its own store holds them), by round; none in a store older
        than schema 5."""
        if not self._db.execute("SELECT 1 FROM sqlite_master WHERE type='table' AND name='manifest_lists'").fetchone():
            return
        for version, data in self._stream("manifest_lists", "round, data", "round", ((bytes, 8), bytes)):
            yield _u64(version), data

    def group_headers(self) -> Iterator[tuple[bytes, bytes, int, float, bool]]:
        """``(digest, subject, version, received, planted)`` by arrival, without the records."""
        for digest, subject, version, received, planted in self._stream(
                "groups", "digest, subject, version, received, planted", "received, rowid",
                ((bytes, 32), bytes, (bytes, 8), float, int)):
            yield digest, subject, _u64(version), received, bool(planted)

    def groups(self) -> Iterator[tuple[bytes, bytes, bytes, int, bool, float]]:
        """``(digest, data, subject, version, planted, received)`` by arrival, one group's bytes at
        a time."""
        for digest, data, subject, version, planted, received in self._stream(
                "groups", "digest, data, subject, version, planted, received", "received, rowid",
                ((bytes, 32), bytes, bytes, (bytes, 8), int, float)):
            yield digest, data, subject, _u64(version), bool(planted), received

    def group(self, digest: bytes) -> bytes | None:
        row = self._db.execute("SELECT data FROM groups WHERE digest=?", (digest,)).fetchone()
        return row[0] if row and isinstance(row[0], bytes) else None

    def verdicts(self) -> Iterator[tuple[bytes, float]]:
        """``(data, received)`` in the order they were received."""
        yield from self._stream("verdicts", "data, received", "received, rowid", (bytes, float))

    def steps(self) -> Iterator[tuple[bytes, float]]:
        yield from self._stream("steps", "data, received", "received, rowid", (bytes, float))

    def trained(self) -> Iterator[tuple[int, tuple[bytes, ...], str]]:
        """``(version, group digests, metrics JSON)``: what the trainer recorded for each version."""
        for version, groups, metrics in self._stream("trained", "version, groups, metrics", "version",
                                                     ((bytes, 8), _Digests, str)):
            yield _u64(version), tuple(groups[i:i + 32] for i in range(0, len(groups), 32)), metrics

    def pruned(self) -> dict[bytes, int]:
        """The blobs this node's storage tier removed or was removing (vrl.node.store's prune
        journal): digest -> the newest version naming it. Empty for a store from before it."""
        tables = {row[0] for row in self._db.execute("SELECT name FROM sqlite_master WHERE type='table'")}
        if "pruned" not in tables:
            return {}
        return {digest: _u64(version) for digest, version in self._stream(
            "pruned", "digest, version", "rowid", ((bytes, 32), (bytes, 8)))}

    def snapshot(self) -> list[tuple[bytes, int, float, bool]]:
        """The reputation table the node last wrote: ``(node, round, score, quarantined)``."""
        return [(node, _u64(r), score, bool(q)) for node, r, score, q in self._stream(
            "reputation", "node, round, score, quarantined", "node", ((bytes, 32), (bytes, 8), float, int))]


class _Digests:
    """The type of a column of concatenated 32-byte digests."""


#: What a column holds: a type, or bytes of one length as ``(bytes, n)``.
_Kind = type | tuple[type[bytes], int]


def _fits(value: object, kind: _Kind) -> bool:
    """Whether a column's value is what the node writes there: an int is a float column's
    value too (SQLite keeps 1.0 as 1); received times and scores must be finite."""
    if kind is _Digests:
        return isinstance(value, bytes) and len(value) % 32 == 0
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

    @property
    def tier(self) -> str | None:
        """The storage tier its node.toml names (specs/storage.md), None without one."""
        return self.config.storage.tier if self.config is not None else None

    @property
    def label(self) -> str:
        """``node-0 (archive)``: the input, and its tier when its node.toml says."""
        return f"{self.name} ({self.tier} tier)" if self.tier else self.name


@dataclass
class Inputs:
    """Everything one audit reads."""

    nodes: list[NodeInput] = field(default_factory=list)
    rollout_files: list[Path] = field(default_factory=list)
    claims: list[Path] = field(default_factory=list)  # held-out evaluation claims (specs/zk.md §9)

    def close(self) -> None:
        for node in self.nodes:
            node.store.close()

    def blob(self, digest: bytes) -> bytes | None:
        """A blob by its SHA-256 from any node folder (:meth:`locate`)."""
        found = self.locate(digest)
        return found[0] if found is not None else None

    def locate(self, digest: bytes) -> tuple[bytes, NodeInput] | None:
        """A blob by its SHA-256 and the node folder it came from: the first copy that is a
        regular file of at most MAX_BLOB_BYTES whose bytes hash to ``digest`` (a damaged copy in
        one folder does not hide a good one in another; a pipe or a device is never opened).
        Archives are looked in first: they are there to be read."""
        for node in sorted(self.nodes, key=lambda n: n.tier != "archive"):
            if node.blob_dir is None:
                continue
            path = node.blob_dir / digest.hex()
            try:
                info = path.stat()
                if not stat.S_ISREG(info.st_mode) or info.st_size > MAX_BLOB_BYTES:
                    continue
                with open(path, "rb") as handle:
                    data = handle.read(MAX_BLOB_BYTES + 1)
            except OSError:
                continue
            if hashlib.sha256(data).digest() == digest:
                return data, node
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
    # The folder's own key: a node.toml's data_dir may name where the folder was made, not
    # where it is now (an audit of a copy must not read the original's).
    key_path = folder / (Path(config.key).name if config is not None else "node.pem")
    if key_path.is_file():
        try:
            key_id = NodeKey.load(key_path).node_id
        except KeyFileError:
            key_id = None  # the store's own record of its owner, or no reputation comparison
    blob_dir = folder / BLOB_DIR
    return NodeInput(name, StoreReader(folder / STORE_FILE), config, blob_dir if blob_dir.is_dir() else None, key_id)


def open_inputs(paths: Sequence[str | Path] | str | Path) -> Inputs:
    """Sort ``paths`` into stores, rollout files and claims: a devnet folder (``node-*/``
    folders), a node folder (with ``node.sqlite``), a ``.sqlite`` store, a rollout file, or an
    evaluation claim (``*.claim.json``). Raises
    :class:`AuditError` naming the first path that is none of them."""
    if isinstance(paths, (str, Path)):
        paths = [paths]
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
            elif path.name.endswith(CLAIM_SUFFIX):
                inputs.claims.append(path)
            elif path.suffix in ROLLOUT_SUFFIXES:
                try:
                    with open(path, "rb") as handle:
                        magic = handle.read(len(FILE_MAGIC))
                except OSError as error:
                    raise AuditError(f"{path}: cannot be read ({error.strerror or error})") from None
                if magic != FILE_MAGIC:
                    raise AuditError(f"{path}: not a vrl rollout file (bad or missing header)")
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


def announced_policy(model_hash: str | None, source: str | Path, *, device: str = "cpu") -> TrainedPolicy:
    """Policy version ``model_hash`` (hex, or a prefix of at least 8 digits; None: the newest
    version whose weights are there) as a node folder or a devnet folder holds it: the
    announcement, its weights blob (checked against the announced blob hash and model hash),
    and the model its ``node.toml`` names. A :class:`~vrl.rl.export.TrainedPolicy`, or an
    :class:`~vrl.rl.export.ExportError` naming the folder. Only what the weights are is
    checked, not how they were made: that is the audit's question."""
    from vrl.node.messages import MessageError, PolicyAnnouncement
    from vrl.node.weights import WeightsError, from_blob
    from vrl.rl.export import ExportError, TrainedPolicy, base_model, hash_prefix

    prefix = "" if model_hash is None else hash_prefix(model_hash)
    try:
        inputs = open_inputs(source)
    except AuditError as error:
        raise ExportError(f"{error}; or a run directory") from None
    unnamed: list[str] = []  # folders that hold the policy but name no model
    try:
        found = []
        for node in inputs.nodes:
            for _, data, _ in node.store.policies():
                try:
                    announcement = PolicyAnnouncement.from_bytes(data)
                except MessageError:
                    continue  # a damaged row is the audit's to report; it names no policy
                if announcement.model_hash.hex().startswith(prefix):
                    found.append((node, announcement))
        if prefix and len({announcement.model_hash for _, announcement in found}) > 1:
            raise ExportError(f"{source}: policy {prefix} is ambiguous: more than one model hash starts with it")
        # Versions that trained nothing keep their parent's weights: the first version named them.
        # Without a hash, the newest version first.
        for node, announcement in sorted(found, key=lambda pair: pair[1].version, reverse=not prefix):
            if node.config is None:
                unnamed.append(node.name)
                continue  # another folder's node.toml may name the model
            blob = inputs.blob(announcement.blob)
            if blob is None:
                continue  # another folder may hold the weights
            spec = node.config.work.model
            try:
                model = from_blob(base_model(spec, device, Path(source)), blob, blob_hash=announcement.blob,
                                  model_hash=announcement.model_hash, name=f"{spec}@{announcement.version}")
            except WeightsError as error:
                raise ExportError(f"{source}: {error}") from None
            return TrainedPolicy(model, spec, announcement.version, Path(source))
    finally:
        inputs.close()
    if unnamed:
        raise ExportError(f"{source}: {', '.join(sorted(set(unnamed)))} holds the policy but no node.toml naming its "
                          "model")
    raise ExportError(f"{source}: no policy announced{f' with model hash {prefix}' if prefix else ''} whose weights "
                      "are on disk (a node keeps the blobs of the versions it followed)")
