"""The node store: idempotent writes, replay, backfill pages, and kill -9 at any point."""

from __future__ import annotations

import signal
import sqlite3
import subprocess
import sys
import time

import pytest

from vrl.keys import NodeKey
from vrl.node.messages import PolicyAnnouncement, SignedVerdict, Submission, audit_ticket
from vrl.node.store import Store, StoreError

KEY = NodeKey.from_seed(b"s" * 32)


def verdict(group: Submission, round_index: int) -> SignedVerdict:
    return SignedVerdict(KEY.node_id, b"w" * 32, group.digest, round_index, round_index,
                         audit_ticket(KEY, group.digest), 1.0, "pass", (), b"\x01" * 32, "p").signed(KEY)


def test_writes_are_idempotent_and_replay_in_a_stable_order(tmp_path):
    store = Store(tmp_path / "n.sqlite")
    policy = PolicyAnnouncement(KEY.node_id, 0, b"\x01" * 32, b"\x02" * 32, 5).signed(KEY)
    groups = [Submission((bytes([i]),)) for i in range(3)]
    assert store.put_policy(policy, 1.0) and not store.put_policy(policy, 2.0)
    for i, g in enumerate(groups):
        assert store.put_group(g, b"w" * 32, 0, 10.0 + i)
        assert store.put_verdict(verdict(g, 0), 20.0 + i)
    assert not store.put_group(groups[0], b"w" * 32, 0, 99.0)
    store.put_trained(1, (groups[0].digest, groups[1].digest), "{}")
    kinds = [kind for kind, _, _ in store.replay()]
    assert kinds == ["policy"] + ["group"] * 3 + ["verdict"] * 3 + ["trained"]
    assert store.trained_versions()[0][1] == (groups[0].digest, groups[1].digest)
    assert store.counts() == {"policies": 1, "groups": 3, "verdicts": 3, "trained": 1}
    store.close()


def test_backfill_pages_cover_everything_once(tmp_path):
    store = Store(tmp_path / "n.sqlite")
    groups = [Submission((bytes([i]) * 300,)) for i in range(20)]
    for i, g in enumerate(groups):
        store.put_group(g, b"w" * 32, i // 5, float(i))
        store.put_verdict(verdict(g, i // 5), float(i))
    pages, after = [], 0
    for _ in range(100):
        page, after = store.since(1, limit_bytes=2000, after=after)
        pages.append(page)
        if after is None:
            break
    messages = [m for page in pages for m in page]
    assert len(pages) > 1 and len(messages) == len(set(messages)) == 2 * 15  # rounds 1..3
    store.close()


def test_a_foreign_or_newer_database_is_refused_by_name(tmp_path):
    path = tmp_path / "n.sqlite"
    Store(path).close()
    with sqlite3.connect(path) as db:
        db.execute("UPDATE meta SET value='99' WHERE key='schema'")
    with pytest.raises(StoreError, match="schema version 99"):
        Store(path)
    (tmp_path / "junk.sqlite").write_bytes(b"not a database" * 100)
    with pytest.raises(StoreError, match="junk.sqlite"):
        Store(tmp_path / "junk.sqlite")


WRITER = """
import sys
from vrl.keys import NodeKey
from vrl.node.messages import Submission
from vrl.node.store import Store
store = Store(sys.argv[1])
for i in range(100000):
    store.put_group(Submission((i.to_bytes(8, "big") * 64,)), b"w" * 32, i // 50, float(i))
    print(i, flush=True)  # acknowledged: the transaction has committed
"""


@pytest.mark.parametrize("after_acks", [10, 200])
def test_kill_minus_nine_loses_nothing_acknowledged(tmp_path, after_acks):
    path = tmp_path / "n.sqlite"
    writer = subprocess.Popen([sys.executable, "-c", WRITER, str(path)], stdout=subprocess.PIPE, text=True)
    acked = -1
    deadline = time.monotonic() + 60
    while acked < after_acks and time.monotonic() < deadline:
        line = writer.stdout.readline()
        if not line:
            break
        acked = int(line)
    writer.send_signal(signal.SIGKILL)
    writer.wait(10)
    assert acked >= after_acks
    with sqlite3.connect(path) as db:
        assert db.execute("PRAGMA integrity_check").fetchone() == ("ok",)
    store = Store(path)
    stored = {Submission.from_bytes(d).records[0][:8] for k, d, _ in store.replay() if k == "group"}
    assert all(i.to_bytes(8, "big") in stored for i in range(acked + 1))
    store.put_group(Submission((b"after",)), b"w" * 32, 0, 0.0)  # and it keeps working
    store.close()
