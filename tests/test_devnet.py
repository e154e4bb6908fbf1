"""A real devnet: `vrl node` processes on libp2p over 127.0.0.1, one of them cheating.

The slowest test here (node processes import torch and libp2p), and the only one that runs
the daemon as an operator would: CLI, TOML, TCP, Noise, gossip, chunked weights, Prometheus.
Bounded by a round count and a deadline; every process is stopped at the end.
"""

from __future__ import annotations

import random

from rich.console import Console

from vrl import devnet
from vrl.keys import NodeKey
from vrl.node.store import Store


def test_a_three_node_libp2p_devnet_quarantines_the_cheater_and_trains(tmp_path):
    port = random.Random().randrange(20000, 27000)  # below the ephemeral range: outgoing dials take those
    summary = devnet.run(tmp_path, 3, ["fabricated-reward"], rounds=2, deadline_s=240, base_port=port,
                         console=Console(file=open("/dev/null", "w")), model="tiny", task="arithmetic:digits=1",
                         group_size=4, groups_per_round=2, max_new_tokens=4, held_out=8, verdict_wait=1.0,
                         plant_every=0)
    assert summary["policy_version"] >= 2, summary
    assert summary["quarantined"] == ["worker-2"], summary
    assert all(code == 0 for code in summary["exit_codes"].values()), summary  # clean SIGTERM shutdown
    cheat = NodeKey.load(tmp_path / "node-2" / "node.pem").node_id
    store = Store(tmp_path / "node-0" / "node.sqlite")
    try:
        trained = [store.group(d).rollouts()[0].node_id for _, groups, _ in store.trained_versions() for d in groups]
    finally:
        store.close()
    assert trained and cheat not in trained
    log = (tmp_path / "node-1" / "node.log").read_text()
    assert '"event": "policy loaded"' in log  # weights arrived by hash over libp2p
