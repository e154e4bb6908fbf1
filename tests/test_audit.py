"""vrl.audit and `vrl audit` on a real devnet's stores (specs/audit.md): the cheats convicted,
the honest nodes clean, nothing written into the inputs, tampered and damaged inputs found,
unusable inputs refused with the path, hostile bytes in a store never a traceback.

One devnet (tiny model, 4 libp2p node processes on 127.0.0.1, one worker fabricating
rewards, a trainer publishing weights no step made from version CHEAT_FROM + 1) serves every test;
each test that changes something works on a copy."""

from __future__ import annotations

import hashlib
import json
import random
import shutil
import sqlite3
from collections import Counter
from pathlib import Path

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st
from rich.console import Console
from typer.testing import CliRunner

import vrl.audit
from tests import fuzzing
from vrl.audit import AuditError, Severity
from vrl.cli import app
from vrl.harness import devnet
from vrl.harness.adversary import CHEAT_FROM
from vrl.node.messages import Outcome, PolicyAnnouncement, SignedVerdict, audit_ticket
from vrl.node.storage import Pruner, StorageConfig
from vrl.node.store import Store
from vrl.rollouts.keys import NodeKey

LOG_CHECKS = ["signatures", "reputation", "duplicates", "lazy_verifiers", "admission", "quarantine"]


@pytest.fixture(scope="module")
def run_dir(tmp_path_factory) -> Path:
    directory = tmp_path_factory.mktemp("audit") / "dn"
    summary = devnet.run(directory, 4, ["fabricated-reward", "trainer-fake-weights"], rounds=CHEAT_FROM + 4,
                         deadline_s=300, base_port=random.Random().randrange(20000, 27000),
                         console=Console(file=open("/dev/null", "w")),
                         work={"model": "tiny", "task": "arithmetic:digits=1", "group_size": 4, "max_new_tokens": 4},
                         # Tickets: these tests tamper with what that design puts in every
                         # store (each verdict gossiped to all, each batch in its announcement).
                         # The committee design's run is audited in tests/test_devnet_committee.py.
                         protocol={"groups_per_round": 2, "verdict_wait": 1.0, "plant_every": 2,
                                   "step_audit_rate": 1.0, "verification": "tickets"},
                         train={"held_out": 8})
    assert summary["failure"] is None, summary
    assert summary["quarantined"] == ["worker-3"], summary
    return directory


def copy_of(run_dir: Path, tmp_path: Path) -> Path:
    target = tmp_path / "dn"
    shutil.copytree(run_dir, target)
    return target


def ids(directory: Path) -> dict[str, str]:
    return {f"node-{i}": NodeKey.load(directory / f"node-{i}" / "node.pem").node_id.hex() for i in range(4)}


def fingerprint(directory: Path) -> dict[str, tuple[str, int]]:
    return {str(p.relative_to(directory)): (hashlib.sha256(p.read_bytes()).hexdigest(), p.stat().st_mtime_ns)
            for p in sorted(directory.rglob("*")) if p.is_file()}


# -- the whole run -------------------------------------------------------------------------------

def test_the_audit_convicts_both_cheats_and_clears_every_honest_node(run_dir):
    before = fingerprint(run_dir)
    result = CliRunner().invoke(app, ["audit", str(run_dir), "--all", "--json", "-q"])
    assert result.exit_code == 1, result.output
    report = json.loads(result.stdout)
    node = ids(run_dir)
    verdicts = {id_: info["verdict"] for id_, info in report["nodes"].items()}
    assert verdicts[node["node-3"]] == "convicted" and "bad_group" in report["nodes"][node["node-3"]]["errors"]
    assert verdicts[node["node-0"]] == "convicted" and "step_fraud" in report["nodes"][node["node-0"]]["errors"]
    assert verdicts[node["node-1"]] == verdicts[node["node-2"]] == "clean", report["nodes"]
    # No one else: the trainer's canaries (its planted groups' throw-away keys, the last round's
    # never revealed) are not nodes.
    assert {i for i, v in verdicts.items() if v != "clean"} == {node["node-0"], node["node-3"]}, report["nodes"]
    frauds = [f for f in report["findings"] if f["code"] == "step_fraud"]
    assert frauds and min(f["evidence"]["version"] for f in frauds) == CHEAT_FROM + 1
    assert all(f["evidence"]["faults"] == ["weights_mismatch"] for f in frauds)
    # Every step before the cheat replays bit for bit; the reputation snapshots are the logs'.
    honest_steps = [s for s in report["series"]["steps"] if s["version"] <= CHEAT_FROM]
    assert honest_steps and all(s["ok"] and s["exact"] for s in honest_steps)
    assert not [f for f in report["findings"] if f["code"] == "snapshot_mismatch"], report["findings"]
    assert report["stats"]["reputation"]["snapshot rows compared"] > 0
    assert fingerprint(run_dir) == before  # read-only: not a byte, not an mtime


def test_the_python_api_and_the_html_report(run_dir, tmp_path):
    with vrl.audit.open([run_dir]) as audit:
        report = audit.run(checks=["signatures", "reputation", "groups", "steps", "accuracy"], sample=1.0)
    assert isinstance(report.findings[0], vrl.audit.Finding) and report.exit_code == 1
    assert {"reputation", "latency", "rejections", "steps", "accuracy"} <= set(report.series)
    assert "reward_mismatch" in report.series["rejections"]
    page = report.write_html(tmp_path / "audit.html").read_text()
    # Self-contained: no URL anywhere. "http" alone can occur by chance inside a base64 image
    # (a fresh clone's run hit it); a URL needs a colon, which base64 never holds.
    assert page.count("<img ") == 5 and "http:" not in page and "https:" not in page
    assert "convicted" in page and "step_fraud" in page
    json.dumps(report.to_json())  # every value serializes


def test_two_audits_at_one_share_reexecute_the_same_items(run_dir):
    with vrl.audit.open([run_dir]) as audit:
        first = audit.run(checks=["groups", "steps"], sample=0.3)
        second = audit.run(checks=["groups", "steps"], sample=0.3)
    assert first.stats["groups"] == second.stats["groups"]
    assert [s["version"] for s in first.series["steps"]] == [s["version"] for s in second.series["steps"]]


# -- what a tampered log shows --------------------------------------------------------------------

def test_a_forged_snapshot_an_unsigned_verdict_and_equivocations_are_findings(run_dir, tmp_path):
    directory = copy_of(run_dir, tmp_path)
    node = ids(directory)
    trainer = NodeKey.load(directory / "node-0" / "node.pem")
    verifier = NodeKey.load(directory / "node-1" / "node.pem")
    store = directory / "node-1" / "node.sqlite"
    with sqlite3.connect(store) as db:
        db.execute("UPDATE reputation SET score = 0.999 WHERE node = ?", (bytes.fromhex(node["node-3"]),))
        grp, data = db.execute("SELECT grp, data FROM verdicts WHERE verifier = ? AND outcome = 'pass' LIMIT 1",
                               (verifier.node_id,)).fetchone()
        honest = SignedVerdict.from_bytes(data)
        # The same verifier says the opposite to another node: a signed contradiction.
        lie = SignedVerdict(**{**honest.__dict__, "outcome": Outcome.HARD_FAIL, "reasons": ("reward_mismatch",),
                               "signature": b""}).signed(verifier)
        forged = SignedVerdict(**{**honest.__dict__, "round": honest.round + 1})  # signature no longer covers it
        db.execute("UPDATE verdicts SET data = ? WHERE grp = ? AND verifier = ?", (forged.to_bytes(), grp,
                                                                                   verifier.node_id))
        first = PolicyAnnouncement.from_bytes(db.execute("SELECT data FROM policies ORDER BY version LIMIT 1 OFFSET 1")
                                              .fetchone()[0])
    with sqlite3.connect(directory / "node-2" / "node.sqlite") as db:
        db.execute("UPDATE verdicts SET data = ?, outcome = 'hard_fail' WHERE grp = ? AND verifier = ?",
                   (lie.to_bytes(), grp, verifier.node_id))
        other = PolicyAnnouncement(**{**first.__dict__, "size": first.size + 1, "signature": b""}).signed(trainer)
        db.execute("UPDATE policies SET data = ? WHERE version = ?",
                   (other.to_bytes(), first.version.to_bytes(8, "big")))
    with vrl.audit.open([directory]) as audit:
        report = audit.run(checks=LOG_CHECKS)
    codes = {(f.code, f.subject) for f in report.findings if f.severity == Severity.ERROR}
    # Whose store it is is the store's own word: the finding names the store, and no node.
    # (node-2's log, holding the lie now, no longer gives its snapshot either)
    assert node["node-1"] in {f.evidence["owner"] for f in report.findings if f.code == "snapshot_mismatch"}
    assert ("snapshot_mismatch", "") in codes
    assert ("bad_signature", "") in codes
    assert ("verifier_equivocation", node["node-1"]) in codes
    assert ("trainer_equivocation", node["node-0"]) in codes


def test_a_batch_with_a_quarantined_nodes_group_is_found(run_dir, tmp_path):
    directory = copy_of(run_dir, tmp_path)
    node = ids(directory)
    trainer = NodeKey.load(directory / "node-0" / "node.pem")
    with sqlite3.connect(directory / "node-0" / "node.sqlite") as db:
        cheat = bytes.fromhex(node["node-3"])
        digest, version = db.execute("SELECT digest, version FROM groups WHERE subject = ? ORDER BY version DESC "
                                     "LIMIT 1", (cheat,)).fetchone()
        last = db.execute("SELECT data, version FROM policies ORDER BY version DESC LIMIT 1").fetchone()
        a = PolicyAnnouncement.from_bytes(last[0])
        padded = PolicyAnnouncement(**{**a.__dict__, "batch": (*a.batch[:-1], (digest, a.batch[-1][1])),
                                       "signature": b""}).signed(trainer)
        db.execute("UPDATE policies SET data = ? WHERE version = ?", (padded.to_bytes(), last[1]))
    with vrl.audit.open([directory / "node-0"]) as audit:
        report = audit.run(checks=["quarantine"])
    found = [f for f in report.findings if f.code in ("trained_quarantined", "stale_group")]
    assert found and all(f.subject == node["node-0"] for f in found), report.findings


# -- damaged and unusable input -------------------------------------------------------------------

def test_unusable_inputs_exit_2_naming_the_path(tmp_path):
    runner = CliRunner()
    junk = tmp_path / "junk.sqlite"
    junk.write_bytes(b"not a database" * 100)
    old = tmp_path / "old.sqlite"
    with sqlite3.connect(old) as db:
        db.execute("CREATE TABLE meta (key TEXT PRIMARY KEY, value TEXT NOT NULL)")
        db.execute("INSERT INTO meta VALUES ('schema', '99')")
    for path, words in ((junk, "not a vrl node store"), (old, "schema version 99"),
                        (tmp_path / "missing", "no such file"), (tmp_path, "neither a devnet folder")):
        result = runner.invoke(app, ["audit", str(path)])
        assert result.exit_code == 2, result.output
        text = " ".join(result.output.split())  # rich wraps at the terminal's width
        assert str(path) in text and words in text, result.output
        assert "Traceback" not in result.output


def test_damaged_rows_missing_blobs_and_truncated_files_are_findings(run_dir, tmp_path):
    directory = copy_of(run_dir, tmp_path)
    with sqlite3.connect(directory / "node-1" / "node.sqlite") as db:
        db.execute("UPDATE verdicts SET data = X'c1c1c1' WHERE rowid = (SELECT min(rowid) FROM verdicts)")
    for node in directory.glob("node-*"):
        shutil.rmtree(node / "blobs")
    records = directory / "r.vrl"
    from vrl.node.store import Store
    from vrl.rollouts.files import write_rollouts

    store = Store(directory / "node-2" / "node.sqlite")
    try:
        digest = next(d for _, groups, _ in Store(directory / "node-0" / "node.sqlite").trained_versions()
                      for d in groups)
        rollouts = store.group(digest).rollouts()
    finally:
        store.close()
    write_rollouts(records, rollouts)
    records.write_bytes(records.read_bytes()[:-20])  # the last record cut short
    result = CliRunner().invoke(app, ["audit", str(directory), str(records), "--all", "--json", "-q"])
    assert result.exit_code == 1, result.output
    codes = {f["code"] for f in json.loads(result.stdout)["findings"]}
    assert {"undecodable", "damaged_file", "weights_unavailable", "step_unreplayable"} <= codes, codes


def test_a_store_with_an_unmerged_write_ahead_log_is_read_through_a_copy(run_dir, tmp_path):
    directory = copy_of(run_dir, tmp_path)
    store = directory / "node-1" / "node.sqlite"
    writer = sqlite3.connect(store)  # a node still running: its last writes are in the -wal only
    writer.execute("PRAGMA journal_mode=WAL")
    writer.execute("PRAGMA wal_autocheckpoint=0")
    writer.execute("UPDATE reputation SET score = 0.5")
    writer.commit()
    try:
        assert (directory / "node-1" / "node.sqlite-wal").stat().st_size > 0
        before = fingerprint(directory)
        with vrl.audit.open([directory / "node-1"]) as audit:
            report = audit.run(checks=["reputation"])
        assert any(f.code == "snapshot_mismatch" for f in report.findings)  # the -wal's write was read
        assert fingerprint(directory) == before
    finally:
        writer.close()


# -- hostile bytes in a store -----------------------------------------------------------------------

@pytest.fixture(scope="module")
def small_store(run_dir, tmp_path_factory) -> Path:
    target = tmp_path_factory.mktemp("hostile") / "node.sqlite"
    shutil.copy(run_dir / "node-0" / "node.sqlite", target)  # the trainer's: its claims are read too
    return target


@settings(max_examples=40, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture])
@given(table=st.sampled_from(["policies", "groups", "verdicts", "steps", "trained", "reputation", "meta"]),
       row=st.integers(0, 3), column=st.integers(0, 7),
       payload=st.one_of(st.binary(max_size=300), st.text(max_size=50), st.integers(-2**63, 2**63 - 1),
                         st.floats(allow_nan=True), st.none(),
                         st.builds(json.dumps, st.dictionaries(st.sampled_from(["held_out_accuracy",
                                                                                "held_out_expected_accuracy"]),
                                                               st.one_of(st.floats(), st.text(), st.none())))))
def test_any_value_in_any_column_is_a_finding_or_an_audit_error(small_store, tmp_path_factory, table, row, column,
                                                                 payload):
    target = fuzzing.store_with_column_set(small_store, tmp_path_factory.mktemp("h"), table, row, column, payload)
    if target is None:
        return  # the database itself refuses it
    try:
        with vrl.audit.open([target]) as audit:  # the store alone: its claims are read, no model re-runs
            report = audit.run(checks=[*LOG_CHECKS, "accuracy"])
    except AuditError as error:
        assert str(target) in str(error)
        return
    assert all(isinstance(f, vrl.audit.Finding) for f in report.findings)


def test_a_claimed_accuracy_that_the_weights_do_not_have_is_found(run_dir, tmp_path):
    directory = copy_of(run_dir, tmp_path)
    with sqlite3.connect(directory / "node-0" / "node.sqlite") as db:
        version, metrics = db.execute("SELECT version, metrics FROM trained ORDER BY version DESC LIMIT 1").fetchone()
        claimed = {**json.loads(metrics), "held_out_accuracy": 0.75}
        db.execute("UPDATE trained SET metrics = ? WHERE version = ?", (json.dumps(claimed), version))
    with vrl.audit.open([directory]) as audit:
        report = audit.run(checks=["accuracy"], sample=0.0)
    found = [f for f in report.findings if f.code == "accuracy_claim"]
    assert [f.evidence["version"] for f in found] == [int.from_bytes(version, "big")], report.findings
    assert found[0].subject == ids(directory)["node-0"] and found[0].evidence["claimed"] == 0.75
    # The honest claims, first version and last, re-measure exactly on the trainer's platform.
    measured = [p for p in report.series["accuracy"] if "measured" in p]
    assert len(measured) == 2 and measured[0]["measured"] == measured[0]["claimed"] and measured[0]["same_platform"]


def test_a_group_left_out_of_a_batch_with_room_is_found(run_dir, tmp_path):
    """The trainer had passed a group itself a whole round before; a batch with room that does
    not list it (and none later does) is a trainer starving that node."""
    from vrl.audit.checks import trainer_index
    from vrl.audit.index import index_run

    directory = copy_of(run_dir, tmp_path)
    with vrl.audit.open([directory]) as audit:
        run = index_run(audit.inputs, lambda *_: None, [])
        index = trainer_index(run)
    passed = {v.group: v.received for v in index.verdicts if v.verifier == run.trainer and v.outcome == "pass"}
    found = next(((v, d) for v, batch in run.batches.items() for d, _ in batch
                  if v >= 2 and passed.get(d, float("inf")) <= index.announced_at[v - 1]), None)
    if found is None:  # timing: every batch took groups that arrived within their own round
        pytest.skip("this devnet's trainer trained no group it had passed a round before")
    version, dropped = found
    trainer = NodeKey.load(directory / "node-0" / "node.pem")
    a = run.policies[version]
    kept = [(d, w) for d, w in a.batch if d != dropped]
    mean = sum(w for _, w in kept) / len(kept)
    forged = PolicyAnnouncement(**{**a.__dict__, "batch": tuple((d, w / mean) for d, w in kept),
                                   "signature": b""}).signed(trainer)
    with sqlite3.connect(directory / "node-0" / "node.sqlite") as db:
        db.execute("UPDATE policies SET data = ? WHERE version = ?", (forged.to_bytes(), version.to_bytes(8, "big")))
    with vrl.audit.open([directory / "node-0"]) as audit:
        report = audit.run(checks=["admission"])
    found = [f for f in report.findings if f.code == "left_out"]
    assert found and found[0].evidence["version"] == version and dropped.hex() in found[0].evidence["groups"]
    assert found[0].subject == run.trainer.hex()


def test_what_a_store_or_a_file_asserts_convicts_no_one(run_dir, tmp_path):
    """Review findings: a store's planted column, a worker's own rollout file beside the stores,
    a verdict reason written as TeX, a row filed under another group's digest, a damaged copy
    of a blob in one folder: none of them blames an honest node or breaks the report."""
    from vrl.node.store import Store
    from vrl.rollouts.files import write_rollouts

    directory = copy_of(run_dir, tmp_path)
    node = ids(directory)
    honest = bytes.fromhex(node["node-1"])
    with sqlite3.connect(directory / "node-2" / "node.sqlite") as db:
        db.execute("UPDATE groups SET planted = 1 WHERE subject = ?", (honest,))  # unsigned: means nothing
        (digest,) = db.execute("SELECT digest FROM groups WHERE subject = ? LIMIT 1", (honest,)).fetchone()
    store = Store(directory / "node-1" / "node.sqlite")
    try:
        write_rollouts(directory / "mine.vrl", store.group(digest).rollouts())  # the worker's own output
    finally:
        store.close()
    shutil.copy(directory / "mine.vrl", directory / "copy.vrl")
    blob = next((directory / "node-0" / "blobs").iterdir())
    blob.write_bytes(b"damaged" + blob.read_bytes()[7:])  # node-1..3 still hold good copies
    verifier = NodeKey.load(directory / "node-2" / "node.pem")
    with sqlite3.connect(directory / "node-2" / "node.sqlite") as db:
        data = db.execute("SELECT data FROM verdicts WHERE verifier = ? LIMIT 1", (verifier.node_id,)).fetchone()[0]
        v = SignedVerdict.from_bytes(data)
        tex = SignedVerdict(**{**v.__dict__, "outcome": Outcome.HARD_FAIL, "reasons": ("$\\undefinedcmd{$",),
                               "signature": b""}).signed(verifier)
        db.execute("UPDATE verdicts SET data = ?, outcome = 'hard_fail' WHERE id = ?", (tex.to_bytes(), v.id))
    with vrl.audit.open([directory, directory / "mine.vrl", directory / "copy.vrl"]) as audit:
        report = audit.run(checks=[*LOG_CHECKS, "steps"], sample=1.0)
    blamed = {f.code for f in report.findings if f.subject in (node["node-1"], node["node-2"], node["node-3"])
              and f.code not in ("verifier_equivocation", "failed_good_group")}
    assert blamed == set(), [f.sentence for f in report.findings if f.code in blamed]
    assert not [f for f in report.findings if f.code in ("replayed_record", "trained_planted", "passed_planted",
                                                          "weights_unavailable")]
    assert "<img " in report.to_html()  # the TeX-looking reason is a label, drawn as text
    json.loads(json.dumps(report.to_json(), allow_nan=False))  # and the JSON is JSON: no Infinity


def test_hostile_folders_are_refused_or_passed_over_never_hang(run_dir, tmp_path):
    import os

    directory = copy_of(run_dir, tmp_path)
    for node in directory.glob("node-*"):  # pipes where blobs should be: never opened
        for blob in list((node / "blobs").iterdir())[:3]:
            blob.unlink()
            os.mkfifo(blob)
    with vrl.audit.open(directory) as audit:  # one path, not a list, is fine too
        report = audit.run(checks="steps", sample=1.0)
    assert report.stats["steps"]["steps"] > 0
    (tmp_path / "junk.vrl").write_bytes(b"x")
    result = CliRunner().invoke(app, ["audit", str(tmp_path / "junk.vrl")])
    assert result.exit_code == 2 and "not a vrl rollout file" in result.output
    viewed = tmp_path / "view.sqlite"
    shutil.copy(run_dir / "node-1" / "node.sqlite", viewed)
    with sqlite3.connect(viewed) as db:
        db.execute("DROP TABLE steps")
        db.execute("CREATE VIEW steps AS WITH RECURSIVE n(x) AS (SELECT 1 UNION ALL SELECT x + 1 FROM n) "
                   "SELECT x AS data, 0.0 AS received, x AS version FROM n")
    with pytest.raises(AuditError, match="no table 'steps'"):
        vrl.audit.open([viewed])
    with sqlite3.connect(tmp_path / "meta.sqlite") as db:
        pass
    odd = tmp_path / "odd.sqlite"
    shutil.copy(run_dir / "node-0" / "node.sqlite", odd)
    with sqlite3.connect(odd) as db:
        db.execute("INSERT OR REPLACE INTO meta VALUES ('node', X'00ff')")
        db.execute("UPDATE trained SET metrics = '{\"held_out_accuracy\": \"0.5\"}'")
    with vrl.audit.open([odd]) as audit:
        audit.run(checks=["reputation", "accuracy"])
    audit.close()
    with pytest.raises(AuditError, match="closed"):
        audit.run()


def test_the_demo_ends_with_the_audit_of_its_devnet(run_dir, tmp_path, capsys):
    from vrl.harness import demo

    directory = copy_of(run_dir, tmp_path)
    html = demo.audit_devnet(directory, sample=1.0)  # every step: the trainer cheats from version 4
    said = " ".join(capsys.readouterr().out.split())
    node = ids(directory)
    assert html.is_file() and "<img " in html.read_text()
    assert "audit: 2 nodes clean (node-1, node-2); convicted: node-0 (" in said, said[-600:]
    assert "node-3 (bad_group" in said and "step_fraud" in said, said[-600:]
    assert "rm -rf" in said  # and where the run's space goes
    assert node["node-3"][:8] in said


def test_the_cli_default_sample_is_the_librarys_and_bad_options_exit_2(run_dir):
    import inspect

    import vrl.cli

    assert inspect.signature(vrl.cli.audit).parameters["sample"].default == vrl.audit.DEFAULT_SAMPLE
    for options, words in ((["--sample", "1.5"], "sample must be a share between 0 and 1"),
                           (["--sample", "nan"], "sample must be a share between 0 and 1"),
                           (["--check", "bogus"], "unknown check 'bogus'")):
        result = CliRunner().invoke(app, ["audit", str(run_dir), *options])
        assert result.exit_code == 2 and words in " ".join(result.output.split()), result.output


def test_a_step_that_trains_a_group_its_trainer_had_failed_is_fraud_however_it_replays(run_dir, tmp_path):
    """specs/training.md §5's rejected_group: the trainer's own signed hard fail, a round before
    the step's, on a group the step trained. The step replays bit for bit; the rule convicts."""
    directory = copy_of(run_dir, tmp_path)
    trainer = NodeKey.load(directory / "node-0" / "node.pem")
    with vrl.audit.open([directory]) as audit:
        from vrl.audit.index import index_run

        run = index_run(audit.inputs, lambda *_: None, [])
    version = 3  # honest (the trainer cheats from CHEAT_FROM + 1 = 4)
    digest = run.batches[version][0][0]
    head = run.groups[digest]
    fail = SignedVerdict(verifier=trainer.node_id, subject=head.subject, group=digest, round=version - 2,
                         policy_version=head.version, ticket=audit_ticket(trainer, digest), rate=1.0,
                         outcome=Outcome.HARD_FAIL, reasons=("reward_mismatch",), digest=b"", platform="p",
                         planted=False).signed(trainer)
    with sqlite3.connect(directory / "node-1" / "node.sqlite") as db:
        db.execute("DELETE FROM verdicts WHERE grp = ? AND verifier = ?", (digest, trainer.node_id))
        db.execute("INSERT INTO verdicts VALUES (?, ?, ?, ?, ?, ?, ?, ?)", (
            fail.id, digest, trainer.node_id, head.subject, head.version.to_bytes(8, "big"), "hard_fail",
            fail.to_bytes(), 1.0))
    with vrl.audit.open([directory]) as audit:
        report = audit.run(checks=["steps"], sample=1.0)
    frauds = {f.evidence["version"]: f.evidence["faults"] for f in report.findings if f.code == "step_fraud"}
    assert frauds.get(version) == ["rejected_group"], frauds


def test_a_race_losses_accusation_its_signers_own_evidence_does_not_reach_is_found(run_dir, tmp_path):
    """specs/verification.md §7 from the log alone: node-1 signs race_losses on an honest node's
    group with 1 race lost of 8 (ln E far below 9.2): unjustified_race_losses; with 40 lost it
    is justified. Re-checks others prompted would not count, and these are its own draws."""
    node = ids(run_dir)
    verifier = NodeKey.load(run_dir / "node-1" / "node.pem")

    def accuse(lost: int) -> list:
        directory = copy_of(run_dir, tmp_path / str(lost))
        with sqlite3.connect(directory / "node-1" / "node.sqlite") as db:
            grp, data = db.execute("SELECT grp, data FROM verdicts WHERE verifier = ? AND subject = ? AND "
                                   "outcome = 'pass' LIMIT 1", (verifier.node_id, bytes.fromhex(node["node-2"]))
                                   ).fetchone()
            honest = SignedVerdict.from_bytes(data)
            accusation = SignedVerdict(**{**honest.__dict__, "outcome": Outcome.HARD_FAIL, "reasons": ("race_losses",),
                                          "rate": 1.0, "race_tokens": 64, "races_lost": lost,
                                          "signature": b""}).signed(verifier)
            db.execute("UPDATE verdicts SET data = ?, outcome = 'hard_fail' WHERE grp = ? AND verifier = ?",
                       (accusation.to_bytes(), grp, verifier.node_id))
        with vrl.audit.open([directory]) as audit:
            report = audit.run(checks=["lazy_verifiers"])
        return [f for f in report.findings if f.code == "unjustified_race_losses"]

    (found,) = accuse(1)
    assert found.subject == node["node-1"] and found.evidence["accused"] == node["node-2"]
    assert accuse(40) == []


def test_race_losses_evidence_is_read_in_the_order_its_signer_stored_it_not_as_others_received_it(run_dir, tmp_path):
    """A 12-node devnet's trainer received a verifier's accusations in another order than the
    verifier signed them, and the audit, reading the trainer's order, called an honest
    verifier's first accusation unjustified. node-1 signs two race_losses fails on node-2's
    groups in one round: A with 40 lost of 64, then B with 1 of 64. Every other store receives
    B first. In node-1's order both are justified; without node-1's store only the round is
    certain, and a same-round check counts as possibly earlier; a check of a later round never
    does."""
    node = ids(run_dir)
    verifier = NodeKey.load(run_dir / "node-1" / "node.pem")
    folders = sorted(p for p in run_dir.iterdir() if (p / "node.sqlite").is_file())

    def accusations(tag: str, rounds: tuple[int, int]) -> Path:
        directory = copy_of(run_dir, tmp_path / tag)
        with sqlite3.connect(directory / "node-1" / "node.sqlite") as db:
            rows = db.execute("SELECT grp, data FROM verdicts WHERE verifier = ? AND subject = ? AND outcome = 'pass' "
                              "ORDER BY received LIMIT 2", (verifier.node_id, bytes.fromhex(node["node-2"]))).fetchall()
        assert len(rows) == 2
        signed = []
        for (grp, data), lost, round_ in zip(rows, (40, 1), rounds, strict=True):
            honest = SignedVerdict.from_bytes(data)
            signed.append((grp, SignedVerdict(**{**honest.__dict__, "outcome": Outcome.HARD_FAIL, "round": round_,
                                                 "reasons": ("race_losses",), "rate": 1.0, "race_tokens": 64,
                                                 "races_lost": lost, "signature": b""}).signed(verifier)))
        for folder in folders:
            with sqlite3.connect(directory / folder.name / "node.sqlite") as db:
                for order, (grp, accusation) in enumerate(signed):
                    # node-1 stored A then B; every other store took B first.
                    at = 1e9 + (order if folder.name == "node-1" else -order)
                    db.execute("UPDATE verdicts SET data = ?, outcome = 'hard_fail', received = ? "
                               "WHERE grp = ? AND verifier = ?", (accusation.to_bytes(), at, grp, verifier.node_id))
        return directory

    def unjustified(paths: list[Path]) -> list:
        with vrl.audit.open(paths) as audit:
            report = audit.run(checks=["lazy_verifiers"])
        return [f for f in report.findings if f.code == "unjustified_race_losses"]

    same_round = accusations("same", (7, 7))
    assert unjustified([same_round]) == []
    assert unjustified([same_round / f.name for f in folders if f.name != "node-1"]) == []
    # B a round before A: B was signed first, on 1 lost of 64, whoever's store is read.
    later = accusations("later", (8, 7))
    (found,) = unjustified([later])
    assert found.subject == node["node-1"] and found.evidence["accused"] == node["node-2"]
    assert len(unjustified([later / f.name for f in folders if f.name != "node-1"])) == 1


def test_a_policy_a_node_followed_is_exported_by_its_hash(run_dir, tmp_path):
    """`vrl export HASH --from DEVNET`: the announcement names the weights blob, the node's
    folder holds it, and its node.toml the architecture."""
    from vrl.audit.sources import StoreReader
    from vrl.rollouts.model import load_model

    reader = StoreReader(run_dir / "node-1" / "node.sqlite")
    try:
        announced = [PolicyAnnouncement.from_bytes(data) for _, data, _ in reader.policies()]
    finally:
        reader.close()
    hashes = Counter(a.model_hash for a in announced)
    announcement = max((a for a in announced if hashes[a.model_hash] == 1), key=lambda a: a.version)
    digest = announcement.model_hash.hex()
    result = CliRunner().invoke(app, ["export", digest[:10], "--from", str(run_dir), "--out", str(tmp_path / "v2")])
    assert result.exit_code == 0, result.output
    assert f"exported policy version {announcement.version} of tiny" in result.output
    assert load_model(tmp_path / "v2").model_hash == announcement.model_hash
    result = CliRunner().invoke(app, ["export", "00000000", "--from", str(run_dir), "--out", str(tmp_path / "x")])
    assert result.exit_code == 2 and "no policy announced" in result.output
    # The folder alone: the newest version whose weights it holds.
    newest = max((a for a in announced if (run_dir / "node-1" / "blobs" / a.blob.hex()).is_file()),
                 key=lambda a: a.version)
    result = CliRunner().invoke(app, ["export", str(run_dir / "node-1"), "--out", str(tmp_path / "newest")])
    assert result.exit_code == 0, result.output
    assert load_model(tmp_path / "newest").model_hash == newest.model_hash


def test_the_archive_replays_every_step_and_the_pruned_ones_are_named(run_dir, tmp_path):
    """The devnet's trainer runs the archive tier (specs/storage.md): the whole devnet replays
    every step, each from the archive. Had it run the default tier, the audit names each step
    it could not replay, and whose prune removed its files."""
    with vrl.audit.open(run_dir) as audit:
        whole = audit.run(checks=["steps"], sample=1.0)
    stats = whole.stats["steps"]
    assert stats["replayed"] == stats["steps"] > 2 and stats["not replayable (missing files)"] == "none", stats
    assert list(stats["replayed from"]) == ["node-0 (archive tier)"], stats
    assert all(s["sources"] == ["node-0 (archive tier)"] for s in whole.series["steps"])
    # Had its trainer kept only the default tier (at max_staleness 1: this run's steps change
    # the weights only from the cheat on), its own prune (the node's code, over its own store)
    # leaves the last two versions' files, and its folder alone replays only the last step.
    directory = copy_of(run_dir, tmp_path)
    trainer = directory / "node-0"
    toml = (trainer / "node.toml").read_text()
    (trainer / "node.toml").write_text(toml.replace('tier = "archive"', 'tier = "default"'))
    store = Store(trainer / "node.sqlite")
    try:
        policies = {v: store.policy(v) for v in range(store.counts()["policies"])}
        latest = max(policies)
        removed = Pruner(StorageConfig(), store, trainer / "blobs", {}, keep=2).prune(policies, latest).removed
    finally:
        store.close()
    assert removed
    with vrl.audit.open(trainer) as audit:
        pruned = audit.run(checks=["steps"], sample=1.0)
    missing = [f for f in pruned.findings if f.code == "step_unreplayable"]
    assert [f.evidence["version"] for f in sorted(missing, key=lambda f: f.evidence["version"])] == list(
        range(1, latest)), [f.sentence for f in missing]
    assert all(f.evidence["pruned_by"] == ["node-0 (default tier)"] for f in missing)
    assert all("pruned by node-0 (default tier); no archive among the inputs" in f.sentence for f in missing)
    stats = pruned.stats["steps"]
    assert stats["replayed"] == 1 and stats["not replayable (missing files)"] == f"1-{latest - 1}", stats
    assert stats["replayed from"] == {"node-0 (default tier)": 1}, stats
    assert {f.code for f in pruned.findings} >= {"step_fraud"}  # the last step is replayed: the cheat
    report = pruned.to_json()
    assert {i["tier"] for i in report["inputs"]} == {"default"}
    assert "not replayable" in pruned.to_html() and "storage tier" in pruned.to_html()
