"""A real libp2p devnet of the committee design (specs/committee.md): five `vrl node` processes
on 127.0.0.1, one cheating. It quarantines the cheat, trains none of its groups, every node
stores the trainer's round manifests, and `vrl audit` of the folder (which re-derives every
committee, specs/audit.md) finds the honest nodes clean. Bounded by a round count and a deadline.

The design is the default one, so this run is also the suite's check of the daemon as an
operator starts it: a relative --dir, each node on its planned key, weights fetched by hash
over libp2p, a clean SIGTERM shutdown (tests/test_devnet.py runs the trainer's cheat)."""

from __future__ import annotations

from pathlib import Path

from rich.console import Console

import vrl.audit
from tests.support import free_port
from vrl.harness import devnet
from vrl.node.store import Store
from vrl.rollouts.keys import NodeKey


def test_a_five_node_committee_devnet_quarantines_the_cheat_and_audits_clean(tmp_path, monkeypatch):
    monkeypatch.chdir(tmp_path)  # a relative --dir, as a user types it
    directory = tmp_path / "dn"
    summary = devnet.run(Path("dn"), 5, ["fabricated-reward"], rounds=3, deadline_s=300, base_port=free_port(),
                         console=Console(file=open("/dev/null", "w")),
                         work={"model": "tiny", "task": "arithmetic:digits=1", "group_size": 4, "max_new_tokens": 4},
                         protocol={"groups_per_round": 2, "verdict_wait": 1.0, "plant_every": 0,
                                   "verification": "committee", "committee_size": 2, "submission_window": 6.0},
                         train={"held_out": 8})
    assert summary["failure"] is None, summary
    assert summary["policy_version"] >= 3, summary
    assert summary["quarantined"] == ["worker-4"], summary
    assert all(code == 0 for code in summary["exit_codes"].values()), summary  # clean SIGTERM shutdown
    assert not (directory / "node-1" / "dn").exists()  # each node used the key it was planned with
    assert '"event": "policy loaded"' in (directory / "node-1" / "node.log").read_text()  # weights by hash
    cheat = NodeKey.load(directory / "node-4" / "node.pem").node_id
    stores = [Store(directory / f"node-{i}" / "node.sqlite") for i in range(5)]
    try:
        trained = [stores[0].group(d).rollouts()[0].node_id
                   for _, groups, _ in stores[0].trained_versions() for d in groups]
        manifests = [{m.round: m for m in store.manifests()} for store in stores]
    finally:
        for store in stores:
            store.close()
    assert trained and cheat not in trained
    assert len(manifests[0]) >= 2  # rounds 0 and 1 at least (tests/test_daemon_committee.py says why)
    for held in manifests[1:4]:  # every honest worker holds the trainer's manifests, byte for byte
        assert held and all(manifests[0][r] == m for r, m in held.items())
    with vrl.audit.open([directory]) as audit:
        report = audit.run(sample=0.25)
    verdicts = report.verdicts_by_node()
    honest = {NodeKey.load(directory / f"node-{i}" / "node.pem").node_id.hex() for i in range(4)}
    for node in verdicts.values():
        if node["id"] in honest:
            assert node["verdict"] == "clean", node
    # Every committee was drawn again (tests/test_audit_committee.py makes each finding): every
    # claim stands, every round's weights table is the trainer's view replayed from its store.
    stats = report.stats["committees"]
    assert stats["manifests"] >= 2 and stats["claims"] > 0 and stats["tables_rederived"] >= 2, stats
    assert not [f for f in report.findings if f.check == "committees"], report.findings
