"""The node store: idempotent writes, replay, backfill pages, and kill -9 at any point."""

from __future__ import annotations

import signal
import sqlite3
import subprocess
import sys
import time

import pytest

from vrl.node.committee import ManifestContent, PagedManifest, WeightsTable
from vrl.node.messages import (
    ManifestLists,
    PolicyAnnouncement,
    RoundManifest,
    SignedVerdict,
    Submission,
    audit_ticket,
    topic_of,
)
from vrl.node.store import Store, StoreError
from vrl.rollouts.keys import NodeKey

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
    assert store.counts() == {"policies": 1, "manifests": 0, "groups": 3, "verdicts": 3, "steps": 0, "trained": 1}
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
from vrl.rollouts.keys import NodeKey
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


U64_MAX = 2**64 - 1


def test_u64_versions_and_rounds_round_trip_in_order(tmp_path):
    """Issue 13 §2: a u64 of 2^63 or more was accepted by the decoder, then raised
    OverflowError inside SQLite; and a backfill `since` of 2^64 - 1 crashed the answering node."""
    store = Store(tmp_path / "n.sqlite")
    edges = [0, 1, 2**32, 2**63 - 1, 2**63, U64_MAX]
    for i, value in enumerate(edges):
        group = Submission((bytes([i]) * 4,))
        assert store.put_group(group, b"w" * 32, value, float(i))
        assert store.put_verdict(verdict(group, value), float(i))
        assert store.put_policy(PolicyAnnouncement(KEY.node_id, value, b"\x01" * 32, b"\x02" * 32, 5).signed(KEY), 0.0)
        store.put_trained(value, (group.digest,), "{}")
    store.put_reputation(U64_MAX, [(b"n" * 32, 0.5, 1.0, False, 0.0, 0)])
    assert [v for v, _, _ in store.trained_versions()] == edges
    assert [extra[1] for kind, _, extra in store.replay() if kind == "group"] == edges
    assert store.policy(U64_MAX).version == U64_MAX and store.reputation()[0][1] == U64_MAX
    top, _ = store.since(2**63, limit_bytes=1 << 20)
    assert len(top) == 3 * 2  # a policy, a group and a verdict at each of 2^63 and 2^64 - 1
    assert store.since(U64_MAX, limit_bytes=1 << 20, after=U64_MAX) == ([], None)
    store.close()


def test_a_version_1_database_is_migrated_in_place_keeping_everything(tmp_path):
    path = tmp_path / "n.sqlite"
    old = sqlite3.connect(path)
    old.executescript("""
        CREATE TABLE meta (key TEXT PRIMARY KEY, value TEXT NOT NULL);
        INSERT INTO meta VALUES ('schema', '1');
        CREATE TABLE policies (version INTEGER PRIMARY KEY, model_hash BLOB NOT NULL, blob BLOB NOT NULL,
            size INTEGER NOT NULL, data BLOB NOT NULL, received REAL NOT NULL);
        CREATE TABLE groups (digest BLOB PRIMARY KEY, subject BLOB NOT NULL, version INTEGER NOT NULL,
            data BLOB NOT NULL, received REAL NOT NULL, planted INTEGER NOT NULL DEFAULT 0);
        CREATE INDEX groups_by_version ON groups (version);
        CREATE TABLE verdicts (id BLOB PRIMARY KEY, grp BLOB NOT NULL, verifier BLOB NOT NULL,
            subject BLOB NOT NULL, round INTEGER NOT NULL, outcome TEXT NOT NULL, data BLOB NOT NULL,
            received REAL NOT NULL, UNIQUE (grp, verifier));
        CREATE INDEX verdicts_by_round ON verdicts (round);
        CREATE TABLE trained (version INTEGER PRIMARY KEY, groups BLOB NOT NULL, metrics TEXT NOT NULL);
        CREATE TABLE reputation (node BLOB PRIMARY KEY, round INTEGER NOT NULL, score REAL NOT NULL,
            check_rate REAL NOT NULL, quarantined INTEGER NOT NULL, trust REAL NOT NULL,
            checked_groups INTEGER NOT NULL);
    """)
    group = Submission((b"g",))
    policy = PolicyAnnouncement(KEY.node_id, 3, b"\x01" * 32, b"\x02" * 32, 5).signed(KEY)
    old.execute("INSERT INTO policies VALUES (3, ?, ?, 5, ?, 1.0)", (b"\x01" * 32, b"\x02" * 32, policy.to_bytes()))
    old.execute("INSERT INTO groups VALUES (?, ?, 3, ?, 2.0, 0)", (group.digest, b"w" * 32, group.to_bytes()))
    v = verdict(group, 3)
    old.execute("INSERT INTO verdicts VALUES (?, ?, ?, ?, 3, 'pass', ?, 3.0)",
                (v.id, group.digest, KEY.node_id, b"w" * 32, v.to_bytes()))
    old.execute("INSERT INTO trained VALUES (3, ?, '{}')", (group.digest,))
    old.commit()
    old.close()
    store = Store(path)
    assert store.counts() == {"policies": 1, "manifests": 0, "groups": 1, "verdicts": 1, "steps": 0, "trained": 1}
    assert store.policy(3) == policy and store.trained_versions() == [(3, (group.digest,), "{}")]
    assert [extra for kind, _, extra in store.replay() if kind == "group"] == [(b"w" * 32, 3, 2.0, False)]
    assert len(store.since(3, 1 << 20)[0]) == 3 and store.since(4, 1 << 20)[0] == []
    store.close()
    assert Store(path).counts()["verdicts"] == 1  # opens again as the current version


def test_a_check_replaces_the_verifiers_own_skip_never_the_reverse(tmp_path):
    store = Store(tmp_path / "n.sqlite")
    group = Submission((b"g",))
    skip = SignedVerdict(KEY.node_id, b"w" * 32, group.digest, 0, 0, audit_ticket(KEY, group.digest), 0.0,
                         "skipped", (), b"", "p").signed(KEY)
    check = verdict(group, 0)
    assert store.put_verdict(skip, 1.0) and store.put_verdict(check, 2.0) and not store.put_verdict(skip, 3.0)
    assert [SignedVerdict.from_bytes(d).outcome for k, d, _ in store.replay() if k == "verdict"] == ["pass"]
    store.close()


def test_an_honest_page_is_one_an_honest_client_accepts_however_small_the_messages(tmp_path):
    """5,000 policies (~240 bytes each) fit 1 MiB but not the client's 4,096-message cap: the
    server's page must stop at the count too, and paging must still reach every message."""
    from vrl.node.requests import BACKFILL_MAX_MESSAGES, BackfillPage

    store = Store(tmp_path / "n.sqlite")
    for version in range(5000):
        store.put_policy(PolicyAnnouncement(KEY.node_id, version, b"\x01" * 32, b"\x02" * 32, 5).signed(KEY), 0.0)
    seen, after = 0, 0
    for _ in range(10):
        page, following = store.since(0, limit_bytes=1 << 20, after=after)
        assert BackfillPage.from_bytes(BackfillPage(tuple(page), following).to_bytes(), after=after).messages
        assert len(page) <= BACKFILL_MAX_MESSAGES
        seen += len(page)
        if following is None:
            break
        after = following
    assert seen == 5000
    store.close()


def test_a_store_is_one_nodes_for_life(tmp_path):
    """vrl.node.store.OWNER_KEY: an auditor reads whose view a store is from it, so a second
    node given the same data_dir is refused rather than mixed in."""
    store = Store(tmp_path / "n.sqlite")
    try:
        store.claim(KEY.node_id)
        store.claim(KEY.node_id)  # the same node again: nothing changes
        with pytest.raises(StoreError, match="belongs to node"):
            store.claim(NodeKey.from_seed(b"t" * 32).node_id)
    finally:
        store.close()


def manifest(round_: int, groups: list[Submission], weights: tuple = ()) -> RoundManifest:
    return RoundManifest.of(KEY.node_id, PagedManifest(lists(round_, groups, weights)).header).signed(KEY)


def lists(round_: int, groups: list[Submission], weights: tuple = ()) -> ManifestContent:
    digests = tuple(sorted(g.digest for g in groups))
    return ManifestContent(round_, WeightsTable(3, weights), digests, ((b"w" * 32, len(digests)),))


def test_manifests_are_kept_one_per_round_and_replayed_before_groups_and_verdicts(tmp_path):
    """specs/committee.md §3.3: the first manifest of a round is the one used; a restart must
    see it before the groups and verdicts of its round (Store.replay's order), and a peer
    catching up gets it on a backfill page before them too."""
    store = Store(tmp_path / "n.sqlite")
    groups = [Submission((bytes([i]),)) for i in range(3)]
    first = manifest(5, groups, ((b"v" * 32, 65536),))
    other = manifest(5, groups[:1])  # equivocation: a second manifest of round 5
    for i, g in enumerate(groups):
        store.put_group(g, b"w" * 32, 5, 1.0 + i)
        store.put_verdict(verdict(g, 5), 2.0 + i)
    assert store.put_manifest(first, 9.0, ManifestLists.of(lists(5, groups, ((b"v" * 32, 65536),))))
    assert not store.put_manifest(other, 10.0)
    assert store.put_manifest(manifest(4, groups[:1]), 11.0)
    assert [m.round for m in store.manifests()] == [4, 5] and store.manifests()[1] == first
    kinds = [kind for kind, _, _ in store.replay()]
    assert kinds == ["manifest"] * 2 + ["group"] * 3 + ["verdict"] * 3
    assert [extra for kind, _, extra in store.replay() if kind == "manifest"] == [
        (11.0, None), (9.0, ManifestLists.of(lists(5, groups, ((b"v" * 32, 65536),))).to_bytes())]
    assert list(store.manifest_lists()) == [5]  # the lists behind it, in the same transaction
    assert store.has(topic_of(first.to_bytes()), first.to_bytes())
    assert not store.has(topic_of(other.to_bytes()), other.to_bytes())
    page, _ = store.since(5, 1 << 20)
    assert [topic_of(m) for m in page] == ["vrl/manifests/1"] + ["vrl/groups/1"] * 3 + ["vrl/verdicts/2"] * 3
    assert store.counts()["manifests"] == 2
    store.close()
    assert Store(tmp_path / "n.sqlite").manifests()[1] == first  # committed


@pytest.mark.parametrize("old", ["2", "3", "4"])
def test_an_older_database_gains_the_manifests_tables_in_place(tmp_path, old):
    """Schema 4 added the manifests table, 5 the manifest_lists table; an older store (made here
    by the current code, then set back: the tables it lacks are created IF NOT EXISTS) opens,
    keeps everything, and takes manifests and their lists."""
    path = tmp_path / "n.sqlite"
    store = Store(path)
    group = Submission((b"g",))
    store.put_group(group, b"w" * 32, 2, 1.0)
    store.close()
    db = sqlite3.connect(path)
    db.execute("DROP TABLE manifest_lists")
    if old != "4":
        db.execute("DROP TABLE manifests")
    if old == "2":
        db.execute("DROP TABLE steps")
    db.execute("UPDATE meta SET value=? WHERE key='schema'", (old,))
    db.commit()
    db.close()
    store = Store(path)
    assert store.counts()["groups"] == 1 and store.counts()["manifests"] == 0
    assert store.put_manifest(manifest(2, [group]), 3.0, ManifestLists.of(lists(2, [group])))
    assert list(store.manifest_lists()) == [2]
    store.close()
    db = sqlite3.connect(path)
    assert db.execute("SELECT value FROM meta WHERE key='schema'").fetchone() == ("5",)
    db.close()
