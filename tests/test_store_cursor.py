"""Backfill by cursor (specs/network.md §6, Store.page): a pass costs what the store took since
the last one, in the order of kinds; a reset, reopened or foreign store answers a full pass."""

from __future__ import annotations

import dataclasses
import tempfile
from pathlib import Path

from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from vrl.node.catchup import FIRST_CURSOR
from vrl.node.messages import (
    PolicyAnnouncement,
    RoundManifest,
    SignedVerdict,
    StepVerdict,
    Submission,
    audit_ticket,
    schema_of,
    topic_of,
)
from vrl.node.requests import BackfillPage, short_id
from vrl.node.store import Store
from vrl.rollouts.keys import NodeKey

KEY = NodeKey.from_seed(b"c" * 32)
# The topics in the order of kinds (specs/network.md §6).
KINDS = [schema_of(kind).topic for kind in (PolicyAnnouncement, RoundManifest, Submission, SignedVerdict, StepVerdict)]


def verdict(group: Submission, version: int, outcome: str = "pass", verifier: bytes = KEY.node_id) -> SignedVerdict:
    return SignedVerdict(verifier, b"w" * 32, group.digest, version, version, audit_ticket(KEY, group.digest),
                         0.0 if outcome == "skipped" else 1.0, outcome, (), b"\x01" * 32, "p").signed(KEY)


def policy(version: int) -> PolicyAnnouncement:
    return PolicyAnnouncement(KEY.node_id, version, b"\x01" * 32, b"\x02" * 32, 5).signed(KEY)


def manifest(version: int) -> RoundManifest:
    """A round manifest's header (specs/committee.md §3.1): one group, no weights."""
    return RoundManifest(KEY.node_id, version, 3, 1, b"\x01" * 32, 0, 0, b"\x02" * 32, 1, b"\x03" * 32).signed(KEY)


def put(store: Store, kind: int, n: int, version: int) -> bytes:
    """Store message ``n`` of a kind (0 policy, 1 manifest, 2 group, 3 verdict) of ``version``."""
    group = Submission((b"g%d" % n,))
    message = [policy(version), manifest(version), group, verdict(group, version)][kind]
    [store.put_policy, store.put_manifest, lambda m, t: store.put_group(m, b"w" * 32, version, t),
     store.put_verdict][kind](message, float(n))
    return message.to_bytes()


def drain(store: Store, since: int, cursor: tuple, limit_bytes: int = 1 << 20,
          honest: bool = True, held: frozenset = frozenset(), salt: bytes = b"") -> tuple[list[bytes], tuple, int]:
    """One pass: pages until the end; returns the messages, the last cursor and the page count.
    Each page is checked as an honest client checks it (unless the cursor is not ``honest``:
    one its server never issued, whose full-pass answer goes back within the generation).
    ``held``: the short ids under ``salt`` the client names (``have``)."""
    out, pages, after = [], 0, 0
    for _ in range(1000):
        messages, following, done, left_out = store.page(since, cursor, limit_bytes, held=held, salt=salt)
        page = BackfillPage(tuple(messages), None if done else after + len(messages) + left_out, following)
        checked = BackfillPage.from_bytes(page.to_bytes(), after, cursor) if honest else page
        out += checked.messages
        pages += 1
        cursor, after = checked.cursor, checked.next
        if after is None:
            return out, cursor, pages
    raise AssertionError("a pass that does not end")


def test_a_second_pass_moves_only_what_was_stored_since(tmp_path):
    store = Store(tmp_path / "n.sqlite")
    first = [put(store, kind, n, 1 + n % 2) for n in range(12) for kind in (2, 3)] + [put(store, 0, 0, 1)]
    put(store, 2, 99, 0)  # of a version below since: never served
    served, cursor, _ = drain(store, 1, FIRST_CURSOR)
    assert sorted(served) == sorted(first) and topic_of(served[0]) == KINDS[0]
    assert drain(store, 1, cursor)[0] == []  # nothing new: an empty page
    later = [put(store, 1, 50, 2), put(store, 2, 51, 2), put(store, 3, 51, 2), put(store, 0, 0, 2)]
    served, cursor, _ = drain(store, 1, cursor)
    # Only the new ones, in the order of kinds: the policy, then the manifest, then its group and verdict.
    assert served == [later[3], later[0], later[1], later[2]]
    assert drain(store, 2, cursor)[0] == []  # a cursor holds for a larger since too
    store.close()


def test_a_check_replacing_a_skip_is_paged_again(tmp_path):
    """A verdict row replaced in place (specs/network.md §3.2) takes a new position: a peer that
    paged the skip gets the check at its next pass, even when the skip was the newest row."""
    store = Store(tmp_path / "n.sqlite")
    group = Submission((b"g",))
    store.put_verdict(verdict(Submission((b"other",)), 3), 0.0)
    skip, check = verdict(group, 3, "skipped"), verdict(group, 3, "pass")
    assert store.put_verdict(skip, 1.0)
    served, cursor, _ = drain(store, 3, FIRST_CURSOR)
    assert skip.to_bytes() in served
    assert store.put_verdict(check, 2.0)
    assert drain(store, 3, cursor)[0] == [check.to_bytes()]
    store.close()


def test_a_reopened_reset_or_foreign_store_answers_a_full_pass(tmp_path):
    """A cursor holds for one opening of one store (its generation): after a restart (rowids may
    have been renumbered offline), on another store (a wiped data_dir), or with a watermark past
    the table's end, the server pages everything, and the client loses nothing."""
    path = tmp_path / "n.sqlite"
    store = Store(path)
    everything = [put(store, kind, n, 4) for n in range(5) for kind in (2, 3)]
    _, cursor, _ = drain(store, 4, FIRST_CURSOR)
    store.close()
    store = Store(path)
    assert sorted(drain(store, 4, cursor)[0]) == sorted(everything)  # reopened: a new generation
    _, cursor, _ = drain(store, 4, cursor)
    past = (cursor[0], *cursor[1:3], cursor[3] + 1, *cursor[4:])  # the right generation, a watermark past the end
    assert sorted(drain(store, 4, past, honest=False)[0]) == sorted(everything)
    store.close()
    fresh = Store(tmp_path / "wiped.sqlite")
    # A store that holds more rows than the cursor's watermarks, all of them other messages.
    other = [put(fresh, kind, n, 4) for n in range(100, 110) for kind in (2, 3)]
    assert sorted(drain(fresh, 4, cursor)[0]) == sorted(other)
    fresh.close()


def test_pages_stop_at_the_byte_and_message_limits_and_resume_by_cursor(tmp_path):
    """A page is at most limit_bytes (but never empty while something is left) and at most
    limit_messages; the next request, by the page's cursor alone, goes on where it stopped."""
    store = Store(tmp_path / "n.sqlite")
    everything = [put(store, kind, n, 0) for n in range(40) for kind in (2, 3)]
    served, _, pages = drain(store, 0, FIRST_CURSOR, limit_bytes=2000)
    assert served == sorted(served, key=lambda m: KINDS.index(topic_of(m)))  # groups, then verdicts
    assert sorted(served) == sorted(everything) and pages > 5
    messages, cursor, done, _ = store.page(0, FIRST_CURSOR, 1 << 20, limit_messages=7)
    assert len(messages) == 7 and not done and cursor[3] == 7 and cursor[4] == 0
    store.close()


# One step of a history: store a message (kind, version), or take one page (byte limit).
STEPS = st.lists(st.one_of(
    st.tuples(st.just("put"), st.integers(0, 3), st.integers(0, 3)),
    st.tuples(st.just("page"), st.sampled_from([300, 1500, 1 << 20]))), min_size=1, max_size=40)


@settings(max_examples=60, deadline=None, derandomize=True, database=None,
          suppress_health_check=[HealthCheck.function_scoped_fixture])
@given(steps=STEPS, since=st.integers(0, 2))
def test_writes_between_pages_are_never_lost_nor_paged_twice(steps, since):
    """However writes and pages interleave, following one peer's cursor pages every message of a
    version >= since exactly once, each page in the order of kinds; a last pass brings the rest."""
    with tempfile.TemporaryDirectory() as folder:
        store = Store(Path(folder) / "n.sqlite")
        stored, served, cursor = [], [], FIRST_CURSOR
        for n, step in enumerate(steps):
            if step[0] == "put":
                data = put(store, step[1], n, step[2])
                if step[2] >= since and data not in stored:
                    stored.append(data)
            else:
                messages, following, *_ = store.page(since, cursor, step[1])
                assert [KINDS.index(topic_of(m)) for m in messages] == sorted(KINDS.index(topic_of(m))
                                                                              for m in messages)
                served += messages
                cursor = following
        served += drain(store, since, cursor)[0]
        assert sorted(served) == sorted(stored) and len(served) == len(set(served))
        store.close()


@settings(max_examples=60, deadline=None, derandomize=True, database=None)
@given(stored=st.lists(st.tuples(st.integers(0, 3), st.integers(0, 3)), min_size=1, max_size=30),
       named=st.lists(st.booleans(), min_size=30, max_size=30),
       junk=st.lists(st.binary(min_size=8, max_size=8), max_size=20), since=st.integers(0, 2),
       limit_bytes=st.sampled_from([300, 1500, 1 << 20]), salt=st.binary(min_size=8, max_size=8))
def test_a_pass_leaves_out_exactly_what_the_client_names(stored, named, junk, since, limit_bytes, salt):
    """``have`` (specs/network.md §6): whatever the client names, held messages or short ids of
    nothing stored, a pass by cursor pages every message of a version >= since it did not name,
    each once, and none it named; every page but the last moves ``next`` on."""
    with tempfile.TemporaryDirectory() as folder:
        store = Store(Path(folder) / "n.sqlite")
        messages = []
        for n, (kind, version) in enumerate(stored):
            data = put(store, kind, n, version)
            if version >= since and data not in messages:
                messages.append(data)
        held = frozenset([short_id(salt, m) for m, name in zip(messages, named, strict=False) if name] + junk)
        served = drain(store, since, FIRST_CURSOR, limit_bytes, held=held, salt=salt)[0]
        assert sorted(served) == sorted(m for m in messages if short_id(salt, m) not in held)
        assert len(served) == len(set(served))
        store.close()


def test_what_a_store_took_since_its_marks_is_named_newest_first(tmp_path):
    """Store.held_since: the short ids of what the store took past its marks, of versions >=
    since, at most ``limit``; the marks move to the tables' ends; nothing new names nothing."""
    store = Store(tmp_path / "n.sqlite")
    old = [put(store, 2, n, 0) for n in range(3)]
    have, marks = store.held_since(0, None, b"s" * 8)
    assert have[:8] == b"s" * 8 and {have[i:i + 8] for i in range(8, len(have), 8)} == {short_id(b"s" * 8, m)
                                                                                    for m in old}
    assert store.held_since(0, marks, b"s" * 8) == (b"", marks)
    new = [put(store, 3, n, 1) for n in range(3, 6)] + [put(store, 2, 9, 0)]
    have, after = store.held_since(1, marks, b"t" * 8)
    assert [have[i:i + 8] for i in range(8, len(have), 8)] == [short_id(b"t" * 8, m) for m in reversed(new[:3])]
    assert after[2] > marks[2] and after[3] > marks[3]
    have, _ = store.held_since(0, None, b"t" * 8, limit=2)
    assert len(have) == 8 + 2 * 8
    store.close()


def test_a_committee_server_pages_a_peer_other_than_the_trainer_only_what_the_design_gossips(tmp_path):
    """specs/network.md §3.5, §6: no group, no member's pass, no step pass; failures, the
    trainer's pass on a group a failure names, fraud step verdicts, policies and manifests; to
    the trainer also what the server sent it. Outside the committee design, everything; by
    cursor and by position alike."""
    from tests.fuzzing import step_verdict

    trainer, member = NodeKey.from_seed(b"T" * 32), NodeKey.from_seed(b"M" * 32)

    def by(key: NodeKey, group: Submission, outcome: str) -> SignedVerdict:
        return dataclasses.replace(verdict(group, 1, outcome), verifier=key.node_id).signed(key)

    store = Store(tmp_path / "n.sqlite")
    g1, g2 = Submission((b"g1",)), Submission((b"g2",))
    everything = [put(store, 0, 0, 1), put(store, 1, 1, 1)]
    for group, subject in ((g1, b"w" * 32), (g2, member.node_id)):
        store.put_group(group, subject, 1, 2.0)
        everything.append(group.to_bytes())
    failure = by(member, g1, "hard_fail")
    member_pass, recheck, fallback = by(member, g2, "pass"), by(trainer, g1, "pass"), by(trainer, g2, "pass")
    for v in (failure, member_pass, recheck, fallback):
        assert store.put_verdict(v, 3.0)
    fraud = step_verdict("fraud")
    step_pass = dataclasses.replace(step_verdict("pass"), verifier=member.node_id).signed(member)
    store.put_step(fraud, 4.0)
    store.put_step(step_pass, 4.0)
    everything += [v.to_bytes() for v in (failure, member_pass, recheck, fallback, fraud, step_pass)]
    gossiped = everything[:2] + [failure.to_bytes(), recheck.to_bytes(), fraud.to_bytes()]
    page = store.page(1, FIRST_CURSOR, 1 << 20, trainer=trainer.node_id)
    assert sorted(page.messages) == sorted(gossiped) and page.done
    assert sorted(store.since(1, 1 << 20, trainer=trainer.node_id)[0]) == sorted(gossiped)
    # The member's own store paged to the trainer: also what the member sent it, its group and
    # its pass (a send that failed reaches the trainer so), and nothing it fetched or stored only.
    sent = gossiped + [g2.to_bytes(), member_pass.to_bytes()]
    page = store.page(1, FIRST_CURSOR, 1 << 20, trainer=trainer.node_id, sender=member.node_id)
    assert sorted(page.messages) == sorted(sent)
    assert sorted(store.since(1, 1 << 20, trainer=trainer.node_id, sender=member.node_id)[0]) == sorted(sent)
    assert sorted(store.page(1, FIRST_CURSOR, 1 << 20).messages) == sorted(everything)
    assert sorted(store.since(1, 1 << 20)[0]) == sorted(everything)
    store.close()
