"""A disk that fills (specs/storage.md §5): while a node writes a blob it made or fetched, and
while it prunes. Nothing it had is lost or damaged, no partial file is left, and the error is
one :class:`vrl.errors.VrlError` naming the file (a prune logs it and goes on).

Each test runs twice: on a real full filesystem (a tmpfs of 2 MiB filled with a filler file,
where this machine lets a test mount one: root on Linux) and with ``os.fsync`` failing with
ENOSPC, where a full disk surfaces on a filesystem that allocates late (ext4, XFS): the call
that makes a write durable is the one that fails."""

from __future__ import annotations

import asyncio
import errno
import hashlib
import os
import subprocess
import sys
from pathlib import Path

import pytest
import structlog
from structlog.testing import capture_logs

from p2p.loopback import LoopbackNetwork
from tests.test_storage import TRAINER, Run, window
from vrl.errors import VrlError
from vrl.node.blobs import Blobs, BlobWriteError
from vrl.node.storage import StorageConfig

NO_SPACE = os.strerror(errno.ENOSPC)  # "No space left on device"


class FullDisk:
    """A folder whose filesystem can be filled (:meth:`fill`) and given room again (:meth:`free`)."""

    def __init__(self, folder: Path, monkeypatch: pytest.MonkeyPatch, real: bool) -> None:
        self.folder, self.monkeypatch, self.real = folder, monkeypatch, real
        self.filler = folder / "filler"

    def fill(self) -> None:
        if self.real:  # write until the filesystem itself says ENOSPC
            with open(self.filler, "wb", buffering=0) as out:
                try:
                    while True:
                        out.write(b"\0" * 4096)
                except OSError as error:
                    assert error.errno == errno.ENOSPC
        else:
            def no_space(descriptor: int) -> None:
                raise OSError(errno.ENOSPC, NO_SPACE)

            self.monkeypatch.setattr(os, "fsync", no_space)

    def free(self) -> None:
        if self.real:
            self.filler.unlink()
        else:
            self.monkeypatch.undo()


@pytest.fixture(params=["tmpfs", "fsync-enospc"])
def disk(request, tmp_path: Path, monkeypatch: pytest.MonkeyPatch):
    folder = tmp_path / "disk"
    folder.mkdir()
    if request.param == "fsync-enospc":
        yield FullDisk(folder, monkeypatch, real=False)
        return
    if not sys.platform.startswith("linux") or os.geteuid() != 0:
        pytest.skip("mounting a small tmpfs needs root on Linux; the fsync-enospc case covers this machine")
    mounted = subprocess.run(["mount", "-t", "tmpfs", "-o", "size=2m", "tmpfs", str(folder)], capture_output=True)
    if mounted.returncode != 0:
        pytest.skip(f"cannot mount a tmpfs here: {mounted.stderr.decode(errors='replace').strip()}")
    try:
        yield FullDisk(folder, monkeypatch, real=True)
    finally:
        subprocess.run(["umount", "-l", str(folder)], check=False)


def _intact(directory: Path) -> dict[str, bytes]:
    """Every file in a blob folder, each checked to hash to its name (nothing partial or damaged)."""
    files = {p.name: p.read_bytes() for p in directory.iterdir()}
    for name, data in files.items():
        assert len(name) == 64 and hashlib.sha256(data).hexdigest() == name, f"{name} is not a whole blob"
    return files


def test_a_blob_write_on_a_full_disk_raises_one_error_naming_the_file_and_changes_nothing(disk: FullDisk) -> None:
    blobs = Blobs(disk.folder / "blobs", LoopbackNetwork().transport(b"n" * 32), TRAINER.node_id,
                  structlog.get_logger())
    kept = [blobs.keep(f"weights {i}".encode() * 1000) for i in range(3)]
    before = _intact(blobs.directory)
    big = os.urandom(64 << 10)  # larger than any room a filled tmpfs has left
    disk.fill()
    with pytest.raises(BlobWriteError) as raised:
        blobs.keep(big)
    assert isinstance(raised.value, VrlError)
    message = str(raised.value)
    assert str(blobs.directory / hashlib.sha256(big).hexdigest()) in message and NO_SPACE in message
    assert _intact(blobs.directory) == before  # no temporary file, no partial blob, the others as they were
    disk.free()
    assert blobs.keep(big) == hashlib.sha256(big).digest()
    assert set(_intact(blobs.directory)) == {d.hex() for d in kept} | {hashlib.sha256(big).hexdigest()}


def test_a_disk_that_fills_during_a_prune_keeps_every_kept_blob_and_the_next_start_finishes_it(
        disk: FullDisk) -> None:
    """On a real full disk the journal's intent fails (SQLITE_FULL) and nothing goes; with the
    folder's fsync failing, the intent is in and some files went. Either way the window is whole,
    every file left is whole, the warning names the folder and the store, and once there is room
    a restart's reconcile and the next prune reach exactly what the tier keeps."""
    run = Run(disk.folder / "node", 20)
    pruner = run.pruner(keep=3)
    disk.fill()
    with capture_logs() as logs:
        result = pruner.prune(run.policies, 19)
    stopped = [e for e in logs if e["event"].startswith("prune stopped")]
    assert len(stopped) == 1 and stopped[0]["folder"] == str(run.blobs.directory)
    assert stopped[0]["store"] == str(run.store.path) and stopped[0]["error"]
    assert window(run.policies, 19, 3) <= run.on_disk()
    _intact(run.blobs.directory)
    assert not disk.real or (result.removed == () and run.store.prune_intents() == [])
    disk.free()
    run.pruner(keep=3).reconcile(run.policies, 19)  # what the node does at its next start
    run.pruner(keep=3).prune(run.policies, 19)
    assert run.on_disk() == window(run.policies, 19, 3) and run.store.prune_intents() == []
    _intact(run.blobs.directory)
    run.store.close()


def test_an_archive_on_a_full_disk_removes_nothing(disk: FullDisk) -> None:
    run = Run(disk.folder / "node", 12)
    before = _intact(run.blobs.directory)
    disk.fill()
    run.pruner(StorageConfig(tier="archive"), keep=3).prune(run.policies, 11)
    assert _intact(run.blobs.directory) == before
    disk.free()
    run.store.close()


def test_a_node_fetching_weights_onto_a_full_disk_logs_the_file_loads_nothing_and_retries(
        tmp_path: Path, tiny, monkeypatch: pytest.MonkeyPatch) -> None:
    """A worker's real fetch path (:meth:`vrl.node.daemon.Node._fetch_policy`): the fetched file
    cannot be stored, so the version is not loaded, the failure is logged naming the file, the
    parent's file is as it was, and the protocol asks again; with room, the same fetch loads it."""
    from p2p.blobs import BlobStore
    from tests.test_deltas import nudged
    from tests.test_node import WORKERS, config
    from vrl.node import protocol as P
    from vrl.node.daemon import Node
    from vrl.node.messages import PolicyAnnouncement
    from vrl.node.weights import to_blob

    def h(data: bytes) -> bytes:
        return hashlib.sha256(data).digest()

    parent, child = to_blob(tiny), to_blob(nudged(tiny))
    model_hash = nudged(tiny).model_hash
    disk = FullDisk(tmp_path, monkeypatch, real=False)

    async def scenario() -> None:
        network = LoopbackNetwork()
        node = Node(config(tmp_path / "worker"), network.transport(WORKERS[0].private_seed()), WORKERS[0])
        holder = network.transport(WORKERS[1].private_seed())
        await node.transport.start()
        await holder.start()
        BlobStore(holder).put(child)
        await node.transport.connect(holder.addresses()[0])
        node.blobs.keep(parent)
        first = PolicyAnnouncement(TRAINER.node_id, 0, tiny.model_hash, h(parent), len(parent)).signed(TRAINER)
        second = PolicyAnnouncement(TRAINER.node_id, 1, model_hash, h(child), len(child),
                                    parent=tiny.model_hash).signed(TRAINER)
        node.protocol.handle(P.PolicyAnnounced(first))
        node.protocol.handle(P.PolicyAnnounced(second))
        disk.fill()
        with capture_logs() as logs:
            await asyncio.wait_for(node._fetch_policy(second), 60)
        failed = [e for e in logs if e["event"] == "policy fetch failed"]
        assert len(failed) == 1 and "BlobWriteError" in failed[0]["error"], logs
        assert str(node.blobs.directory / h(child).hex()) in failed[0]["error"] and NO_SPACE in failed[0]["error"]
        assert 1 not in node.protocol.loaded
        assert _intact(node.blobs.directory) == {h(parent).hex(): parent}
        disk.free()
        await asyncio.wait_for(node._fetch_policy(second), 60)
        assert 1 in node.protocol.loaded and node.work.models[1].model_hash == model_hash
        assert _intact(node.blobs.directory) == {h(parent).hex(): parent, h(child).hex(): child}
        node.store.close()
        await node.transport.close()
        await holder.close()

    asyncio.run(scenario())


def test_a_trainer_whose_disk_fills_at_announce_loses_no_step_and_announces_it_at_restart(
        tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """The trainer's step is in its checkpoint before its files are stored: a full disk then
    makes :meth:`Training.announce` raise one BlobWriteError naming the file and store no
    announcement; :meth:`Training.train` logs it and trains no more. A restart with room
    announces that version from the checkpoint: the same weights and optimizer state."""
    from p2p.loopback import LoopbackNetwork as Network
    from tests.test_node import TRAINER as NODE_TRAINER
    from tests.test_node import config
    from vrl.node.catchup import replay_store
    from vrl.node.daemon import Node

    node_config = config(tmp_path / "trainer", roles=("trainer", "verifier"), train={"eval_every": 1000})
    disk = FullDisk(tmp_path, monkeypatch, real=False)

    def start() -> Node:
        node = Node(node_config, Network().transport(NODE_TRAINER.private_seed()), NODE_TRAINER)
        replay_store(node.store, node.protocol)
        return node

    async def bootstrap(node: Node) -> None:
        await node.transport.start()
        await node._events(node.training.bootstrap())  # each event fed as the daemon feeds it

    async def scenario() -> None:
        node = start()
        await bootstrap(node)
        groups = node.work.generate(0)
        for group in groups:  # as the daemon stores a group it received, for the step to read
            node.store.put_group(group.submission, group.subject, group.version, 0.0)
        stepped = node.trainer.step

        def step_then_full(*args, **kwargs):  # the disk fills once the step's checkpoint is written
            result = stepped(*args, **kwargs)
            disk.fill()
            return result

        monkeypatch.setattr(node.trainer, "step", step_then_full)
        with capture_logs() as logs:
            events = [e async for e in node.training.train(1, tuple((g.digest, 1.0) for g in groups))]
        assert events == [] and node.store.policy(1) is None and node.trainer.version == 1
        failed = [e for e in logs if e["event"].startswith("cannot store the new version's files")]
        assert len(failed) == 1 and failed[0]["version"] == 1, logs
        assert str(node.blobs.directory) in failed[0]["error"] and NO_SPACE in failed[0]["error"]
        model_hash = node.trainer.policy().model_hash
        with pytest.raises(BlobWriteError, match=NO_SPACE):  # announce itself: one error, naming the file
            node.training.announce(node.trainer.current())
        disk.free()
        node.training.close()
        node.model_thread.shutdown()
        node.store.close()
        await node.transport.close()
        again = start()
        await bootstrap(again)
        announced = again.protocol.policies[1]
        assert again.trainer.version == 1 and announced.model_hash == model_hash
        assert (again.blobs.directory / announced.blob.hex()).is_file()
        assert (again.blobs.directory / announced.optimizer.hex()).is_file()
        again.training.close()
        again.model_thread.shutdown()
        again.store.close()
        await again.transport.close()

    asyncio.run(scenario())
