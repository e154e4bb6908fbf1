"""Storage tiers (specs/storage.md): what a node keeps, the prune's bound and pins, a prune cut
short at every step, a full disk during a prune, a pruned blob asked for, and [storage] config."""

from __future__ import annotations

import asyncio
import dataclasses
import hashlib
import sqlite3
from pathlib import Path

import pytest
import structlog
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from p2p.blobs import BlobUnavailable, _file_chunk, fetch_blob
from p2p.loopback import LoopbackNetwork
from vrl.config import ConfigError
from vrl.node.blobs import Blobs
from vrl.node.config import NodeConfig
from vrl.node.messages import PolicyAnnouncement
from vrl.node.storage import Pruner, StorageConfig, named, prunable, replay_needs, retained, step_drawn
from vrl.node.store import Store
from vrl.rollouts.keys import NodeKey

TRAINER = NodeKey.from_seed(b"T" * 32)
CONFIG_FILE = b"the step config, alike every version"


def _digest(data: bytes) -> bytes:
    return hashlib.sha256(data).digest()


class Run:
    """A trainer's run as a node's blob folder and store hold it: ``versions`` announcements,
    each naming its weights, optimizer state and the one step config, every file on disk."""

    def __init__(self, folder: Path, versions: int, *, repeat_weights: set[int] = frozenset()) -> None:
        self.folder = folder
        self.store = Store(folder / "node.sqlite")
        self.blobs = Blobs(folder / "blobs", LoopbackNetwork().transport(b"n" * 32), TRAINER.node_id,
                           structlog.get_logger())
        self.policies: dict[int, PolicyAnnouncement] = {}
        for version in range(versions):
            self.publish(version, repeat=version in repeat_weights)

    def publish(self, version: int, repeat: bool = False) -> PolicyAnnouncement:
        # A version that trained nothing keeps its parent's weights: the same blob, named twice.
        weights = self.blobs.keep(f"weights {version - 1 if repeat else version}".encode() * 50)
        optimizer = self.blobs.keep(f"optimizer {version}".encode() * 100)
        parent = self.policies.get(version - 1)
        announcement = PolicyAnnouncement(
            TRAINER.node_id, version, _digest(b"model %d" % version), weights, 10,
            parent=parent.model_hash if parent else b"", config=self.blobs.keep(CONFIG_FILE),
            optimizer_before=parent.optimizer if parent else b"", optimizer=optimizer, optimizer_size=10,
        ).signed(TRAINER)
        self.store.put_policy(announcement, 0.0)
        self.policies[version] = announcement
        return announcement

    def pruner(self, config: StorageConfig = StorageConfig(), keep: int = 3) -> Pruner:
        return Pruner(config, self.store, self.blobs.directory, self.blobs.pins, keep)

    def on_disk(self) -> set[bytes]:
        return {bytes.fromhex(p.name) for p in self.blobs.directory.iterdir() if len(p.name) == 64}


def window(policies: dict[int, PolicyAnnouncement], latest: int, keep: int) -> set[bytes]:
    """What the default tier must keep, written out plainly: each window version's own files,
    and the optimizer state before each step whose parent is in the window too."""
    out = set()
    for v in range(max(latest - keep + 1, 0), latest + 1):
        out |= named(policies[v])
        if v > latest - keep + 1 and v > 0:
            out.add(policies[v].optimizer_before)
    return out


def test_default_tier_keeps_exactly_the_window(tmp_path: Path) -> None:
    run = Run(tmp_path, 12)
    pruner = run.pruner(keep=3)
    for latest in range(12):
        pruner.after(run.policies, latest)
        assert run.on_disk() == window(run.policies, latest, 3) | (
            set().union(*(named(run.policies[v]) for v in range(latest + 1, 12))))
    # 3 versions of weights and optimizer state, and the one step config: 7 files, whatever the length.
    assert len(run.on_disk()) == 7
    journal = run.store.pruned()
    assert all(state == "done" for _, state in journal.values())
    assert set(journal).isdisjoint(run.on_disk())


def test_a_blob_named_by_a_kept_version_is_kept(tmp_path: Path) -> None:
    """Content addressing: an old version's file that a kept version names too (unchanged
    weights, the shared step config) is kept."""
    run = Run(tmp_path, 8, repeat_weights={5})  # version 5 keeps version 4's weights
    run.pruner(keep=3).prune(run.policies, 7)  # window 5..7
    assert run.policies[4].blob == run.policies[5].blob and run.policies[4].blob in run.on_disk()
    assert run.policies[0].config in run.on_disk()
    assert run.policies[4].optimizer not in run.on_disk()


def test_a_weights_delta_is_pruned_with_its_version(tmp_path: Path) -> None:
    """A version's weights delta (specs/network.md §6.1) is one of the files it names: kept in
    the window, pruned after it, never left behind to pile up."""
    run = Run(tmp_path, 2)
    deltas = {}
    for version in range(2, 8):
        plain = run.publish(version)
        delta = run.blobs.keep(f"delta {version}".encode() * 5)
        announcement = dataclasses.replace(plain, delta=delta, delta_size=len(f"delta {version}".encode() * 5),
                                           delta_parent=run.policies[version - 1].blob).signed(TRAINER)
        run.store.put_policy(announcement, 0.0)
        run.policies[version], deltas[version] = announcement, delta
    run.pruner(keep=3).prune(run.policies, 7)  # window 5..7
    assert {deltas[v] for v in (5, 6, 7)} <= run.on_disk()
    assert not {deltas[v] for v in (2, 3, 4)} & run.on_disk()


def test_a_file_no_announcement_names_is_never_pruned(tmp_path: Path) -> None:
    """A trainer's next step writes its files before it announces them."""
    run = Run(tmp_path, 6)
    pending = run.blobs.keep(b"reward proofs of a step not announced yet")
    run.pruner(keep=2).prune(run.policies, 5)
    assert pending in run.on_disk()


def test_pins_are_respected_then_released(tmp_path: Path) -> None:
    run = Run(tmp_path, 6)
    pruner = run.pruner(keep=2)
    replayed = replay_needs(run.policies[2], run.policies[1])
    with run.blobs.pinned(replayed):
        result = pruner.prune(run.policies, 5)
        assert replayed <= run.on_disk()
        assert result.skipped_pinned > 0
    assert not run.blobs.pins
    pruner.prune(run.policies, 5)
    assert run.on_disk().isdisjoint(replayed - window(run.policies, 5, 2))


def test_archive_keeps_everything_or_the_drawn_steps(tmp_path: Path) -> None:
    run = Run(tmp_path / "all", 10)
    everything = run.on_disk()
    run.pruner(StorageConfig(tier="archive"), keep=3).prune(run.policies, 9)
    assert run.on_disk() == everything
    sampled = Run(tmp_path / "some", 30)
    config = StorageConfig(tier="archive", archive_sample=0.3)
    sampled.pruner(config, keep=3).prune(sampled.policies, 29)
    drawn = [v for v in range(1, 30) if step_drawn(sampled.policies[v], 0.3)]
    assert 0 < len(drawn) < 29  # the draw picks some steps, not all (fixed keys: deterministic)
    for v in drawn:
        assert replay_needs(sampled.policies[v], sampled.policies[v - 1]) <= sampled.on_disk()
    assert sampled.on_disk() == retained(sampled.policies, 29, 3, config)
    # An audit at a lower share draws a subset of those steps: all of them are there.
    assert {v for v in range(1, 30) if step_drawn(sampled.policies[v], 0.1)} <= set(drawn)


@settings(max_examples=40, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture])
@given(versions=st.integers(1, 14), keep=st.integers(1, 5), data=st.data())
def test_prune_bound_property(tmp_path_factory, versions: int, keep: int, data) -> None:
    """Whatever the run's length, window and the versions' order of arrival: what stays is the
    window (and files of versions not yet pruned against), and never fewer."""
    folder = tmp_path_factory.mktemp("run")
    run = Run(folder, versions, repeat_weights=set(data.draw(st.sets(st.integers(1, 13)))))
    pruner = run.pruner(keep=keep)
    latest = data.draw(st.integers(0, versions - 1))
    pruner.prune(run.policies, latest)
    assert window(run.policies, latest, keep) <= run.on_disk()
    newer = set().union(*(named(run.policies[v]) for v in range(latest + 1, versions)))
    assert run.on_disk() <= window(run.policies, latest, keep) | newer | {
        run.policies[v].optimizer_before for v in range(latest + 1, versions)}
    assert set(prunable(run.policies, latest, keep, StorageConfig())).isdisjoint(run.on_disk())


def test_a_prune_cut_short_at_any_step_is_finished_at_start(tmp_path: Path) -> None:
    """A crash after each durable step of the prune (intent, each unlink, directory sync):
    the next start's reconcile leaves the same folder as a prune that ran through, and no
    needed blob is ever gone meanwhile."""
    reference = Run(tmp_path / "reference", 9)
    reference.pruner(keep=3).prune(reference.policies, 8)
    expected = reference.on_disk()
    stops = len(list(Run(tmp_path / "count", 9).pruner(keep=3).steps(reference.policies, 8)))
    assert stops > 3
    for stop in range(stops):
        run = Run(tmp_path / f"crash-{stop}", 9)
        needed = window(run.policies, 8, 3)
        steps = run.pruner(keep=3).steps(run.policies, 8)
        for _ in range(stop + 1):
            next(steps)
            assert needed <= run.on_disk()
        steps.close()  # the process dies here: nothing after this step ran
        run.store.close()
        restarted = Store(tmp_path / f"crash-{stop}" / "node.sqlite")
        Pruner(StorageConfig(), restarted, run.blobs.directory, {}, 3).reconcile(run.policies, 8)
        assert run.on_disk() == expected, f"stopped after step {stop}"
        assert restarted.prune_intents() == []
        assert set(restarted.pruned()).isdisjoint(run.on_disk())


def test_a_restart_as_archive_cancels_an_unfinished_prune(tmp_path: Path) -> None:
    run = Run(tmp_path, 8)
    steps = run.pruner(keep=3).steps(run.policies, 7)
    next(steps)  # the intent, and no file removed yet
    steps.close()
    intents = run.store.prune_intents()
    assert intents
    run.pruner(StorageConfig(tier="archive"), keep=3).reconcile(run.policies, 7)
    assert set(intents) <= run.on_disk() and run.store.prune_intents() == []


def test_a_full_disk_during_a_prune_loses_nothing(tmp_path: Path) -> None:
    """SQLite's own limit on the database's pages (PRAGMA max_page_count) fails the intent's
    transaction with SQLITE_FULL, as a full disk does: the prune removes nothing, and says so;
    once there is room the next prune goes through."""
    run = Run(tmp_path, 60)
    before = run.on_disk()
    db = run.store._db  # the store's own connection: the limit is per connection
    pages = db.execute("PRAGMA page_count").fetchone()[0]
    db.execute(f"PRAGMA max_page_count={pages}")
    with pytest.raises(sqlite3.OperationalError, match="full"):
        list(run.pruner(keep=3).steps(run.policies, 59))
    assert run.on_disk() == before and run.store.prune_intents() == []
    assert run.pruner(keep=3).prune(run.policies, 59).removed == ()  # logged, not raised
    assert run.on_disk() == before
    db.execute("PRAGMA max_page_count=1073741823")
    assert len(run.pruner(keep=3).prune(run.policies, 59).removed) > 100
    assert window(run.policies, 59, 3) <= run.on_disk()


def test_a_pruned_blob_is_not_here_and_the_fetcher_asks_the_archive(tmp_path: Path) -> None:
    async def scenario() -> None:
        network = LoopbackNetwork()
        pruned_node = Run(tmp_path / "default", 8)
        archive = Run(tmp_path / "archive", 8)
        pruned_node.pruner(keep=3).prune(pruned_node.policies, 7)
        old = pruned_node.policies[1].optimizer
        assert old not in pruned_node.on_disk() and old in archive.on_disk()
        transports = [network.transport(bytes([i]) * 32) for i in (1, 2, 3)]
        Blobs(pruned_node.blobs.directory, transports[0], TRAINER.node_id, structlog.get_logger())
        Blobs(archive.blobs.directory, transports[1], TRAINER.node_id, structlog.get_logger())
        for t in transports:
            await t.start()
        await transports[2].connect(transports[0].addresses()[0])
        await transports[2].connect(transports[1].addresses()[0])
        asker, pruned_peer, archive_peer = transports[2], transports[0].peer_id, transports[1].peer_id
        with pytest.raises(BlobUnavailable, match="does not have chunk 0"):
            await fetch_blob(asker, [pruned_peer], old, max_size=1 << 20)
        assert _digest(await fetch_blob(asker, [pruned_peer, archive_peer], old, max_size=1 << 20)) == old
        # A kept blob is served from the folder by both.
        kept = pruned_node.policies[7].blob
        assert _digest(await fetch_blob(asker, [pruned_peer], kept, max_size=1 << 20)) == kept
        for t in transports:
            await t.close()

    asyncio.run(asyncio.wait_for(scenario(), 30))


def test_a_damaged_file_is_not_served(tmp_path: Path) -> None:
    path = tmp_path / "blob"
    path.write_bytes(b"x" * 100)
    assert _file_chunk(path, _digest(b"x" * 100), 0) == [100, b"x" * 100]
    path.write_bytes(b"y" * 100)  # bit rot, a hand edit: its hash no longer matches
    assert _file_chunk(path, _digest(b"x" * 100), 0) is None
    assert _file_chunk(tmp_path / "gone", _digest(b"x" * 100), 0) is None


@settings(max_examples=60, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture])
@given(content=st.binary(max_size=3000), digest=st.binary(min_size=32, max_size=32),
       index=st.integers(0, 2**64 - 1), honest=st.booleans())
def test_file_chunk_answers_a_chunk_or_not_here(tmp_path: Path, content: bytes, digest: bytes, index: int,
                                                honest: bool) -> None:
    """The disk-backed handler, for any file and any (digest, index) a peer asks: a chunk that
    fits the file, or None; never an exception."""
    path = tmp_path / "blob"
    path.write_bytes(content)
    asked = _digest(content) if honest else digest
    answer = _file_chunk(path, asked, index)
    if answer is not None:
        size, chunk = answer
        assert size == len(content) and chunk == content[index * (1 << 20):(index + 1) * (1 << 20)]
        assert asked == _digest(content) or index > 0


# -- [storage] in node.toml -------------------------------------------------------------------------

BASE = f'data_dir = "d"\ntrainer = "{"ab" * 32}"\n'


def test_storage_table_reads_and_defaults(tmp_path: Path) -> None:
    config = NodeConfig.from_toml_bytes(BASE.encode(), tmp_path / "node.toml")
    assert config.storage == StorageConfig() and config.storage.tier == "default"
    archive = NodeConfig.from_toml_bytes((BASE + '[storage]\ntier = "archive"\narchive_sample = 0.25\n').encode(),
                                         tmp_path / "node.toml")
    assert archive.storage == StorageConfig(tier="archive", archive_sample=0.25)
    assert "[storage]" in archive.to_toml()


@pytest.mark.parametrize(("table", "key", "words"), [
    ('tier = "everything"', "tier", "expected one of 'default', 'archive'"),
    ('tier = "archive"\narchive_sample = 1.5', "archive_sample", "1"),
    ("archive_sample = 0.5", "archive_sample", 'tier = "archive" only'),
    ('tier = "archive"\nsample = 0.5', "sample", ""),
])
def test_storage_mistakes_name_the_file_and_key(tmp_path: Path, table: str, key: str, words: str) -> None:
    with pytest.raises(ConfigError) as caught:
        NodeConfig.from_toml_bytes((BASE + "[storage]\n" + table + "\n").encode(), tmp_path / "node.toml")
    message = str(caught.value)
    assert str(tmp_path / "node.toml") in message and f"[storage] {key}" in message and words in message
