"""Prometheus metrics of one node, served on 127.0.0.1 (``metrics_port`` in node.toml)."""

from __future__ import annotations

from collections.abc import Callable, Iterator

from prometheus_client import CollectorRegistry, Counter, Gauge, Histogram, start_http_server
from prometheus_client.core import CounterMetricFamily, Metric

from p2p.traffic import Count


class NodeMetrics:
    """One registry per node, so several nodes can live in one process (tests)."""

    def __init__(self) -> None:
        self.registry = r = CollectorRegistry()
        self.rollouts_produced = Counter("vrl_rollouts_produced", "Rollouts this node generated", registry=r)
        self.groups_received = Counter("vrl_groups_received", "Submissions accepted into the store", registry=r)
        self.checks = Counter("vrl_groups_checked", "Groups this node checked, by outcome", ["outcome"], registry=r)
        self.skipped = Counter("vrl_groups_skipped", "Groups this node's audit ticket did not draw", registry=r)
        self.rejected = Counter("vrl_rollouts_rejected", "Records this node's checks rejected, by reason",
                                ["reason"], registry=r)
        self.verdicts = Counter("vrl_verdicts_received", "Verdicts stored, by outcome", ["outcome"], registry=r)
        self.invalid = Counter("vrl_messages_invalid", "Gossip messages refused by validators, by topic",
                               ["topic"], registry=r)
        self.backfilled = Counter("vrl_backfilled", "Messages gossip missed that backfill brought, by topic",
                                  ["topic"], registry=r)
        self.backfill_waiting = Gauge("vrl_backfill_waiting", "Backfilled messages this node could not take yet, "
                                      "kept to offer again (specs/network.md §6)", registry=r)
        self.reputation = Gauge("vrl_reputation", "Reputation score (Beta lower bound) per peer", ["peer"], registry=r)
        self.check_rate = Gauge("vrl_check_rate", "Spot-check rate applied per peer", ["peer"], registry=r)
        self.quarantined = Gauge("vrl_quarantined", "1 if the peer is quarantined", ["peer"], registry=r)
        self.policy_version = Gauge("vrl_policy_version", "Newest policy version known", registry=r)
        self.groups_trained = Counter("vrl_groups_trained", "Groups admitted into GRPO batches (trainer)",
                                      ["peer"], registry=r)
        self.held_out_accuracy = Gauge("vrl_held_out_accuracy", "Trainer's held-out accuracy of its policy",
                                       registry=r)
        self.expected_accuracy = Gauge("vrl_held_out_expected_accuracy",
                                       "Trainer's held-out probability of sampling the exact answer", registry=r)
        self.step_seconds = Histogram("vrl_step_seconds", "Seconds per unit of model work, by kind", ["kind"],
                                      registry=r, buckets=(0.05, 0.1, 0.25, 0.5, 1, 2, 5, 10, 30, 60, 120))
        self.work_seconds = Counter("vrl_work_seconds", "Wall seconds model-thread jobs ran, by kind (no queueing)",
                                    ["kind"], registry=r)
        self.work_cpu_seconds = Counter("vrl_work_cpu_seconds", "CPU seconds of the model thread's jobs, by kind",
                                        ["kind"], registry=r)
        self.peers = Gauge("vrl_peers", "Connected peers", registry=r)
        self.steps_replayed = Counter("vrl_steps_replayed", "Training steps this node replayed or judged, by outcome",
                                      ["outcome"], registry=r)
        self.step_drift = Gauge("vrl_step_drift", "Relative weight drift of this node's last step replay",
                                registry=r)
        self.trainer_convicted = Gauge("vrl_trainer_convicted",
                                       "1 once trainer fraud is confirmed: this node follows it no further",
                                       registry=r)
        self.trainer_fraud_version = Gauge("vrl_trainer_fraud_version",
                                           "The first policy version of a convicted trainer this node refused",
                                           registry=r)

    def watch_traffic(self, traffic: Callable[[], dict[tuple[str, str], Count]]) -> None:
        """Export the transport's payload counters (:meth:`p2p.transport.Transport.traffic`) as
        ``vrl_payload_messages_total`` and ``vrl_payload_bytes_total``, by ``kind`` and ``name``
        (topic or protocol), read at each scrape: the transport counts them, once."""
        self.registry.register(_TrafficCollector(traffic))

    def serve(self, port: int) -> int:
        """Serve on 127.0.0.1 only; returns the bound port (``port`` 0 picks a free one)."""
        server, _thread = start_http_server(port, addr="127.0.0.1", registry=self.registry)
        return int(server.server_port)


class _TrafficCollector:
    """A prometheus-client custom collector over a transport's traffic snapshot."""

    def __init__(self, traffic: Callable[[], dict[tuple[str, str], Count]]) -> None:
        self._traffic = traffic

    def collect(self) -> Iterator[Metric]:
        messages = CounterMetricFamily("vrl_payload_messages", "Payload messages the transport carried, by kind and "
                                       "topic or protocol (p2p.traffic)", labels=["kind", "name"])
        size = CounterMetricFamily("vrl_payload_bytes", "Payload bytes the transport carried, by kind and topic or "
                                   "protocol (p2p.traffic)", labels=["kind", "name"])
        for (kind, name), count in sorted(self._traffic().items()):
            messages.add_metric([kind, name], count.messages)
            size.add_metric([kind, name], count.bytes)
        yield messages
        yield size
