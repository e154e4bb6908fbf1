"""The counters the calibration against real devnets reads (bench/devnet.py costs, issue 30):
payload traffic exported from the transport, and the model thread's seconds per job."""

from __future__ import annotations

import asyncio
import hashlib
import time

from p2p.loopback import LoopbackNetwork
from p2p.traffic import GOSSIP_IN, GOSSIP_OUT, REQUEST_IN, RESPONSE_IN
from p2p.transport import Message
from vrl.node.metrics import NodeMetrics
from vrl.node.work import ModelThread


def sample(metrics: NodeMetrics, metric: str, **labels: str) -> float:
    return metrics.registry.get_sample_value(metric, labels) or 0.0


def test_a_nodes_metrics_export_its_transports_payload_counts_as_they_move() -> None:
    async def scenario() -> None:
        network = LoopbackNetwork(seed=3)
        a, b = (network.transport(hashlib.sha256(name).digest()) for name in (b"a", b"b"))
        received: list[Message] = []

        async def keep(message: Message) -> None:
            received.append(message)

        async def answer(peer: bytes, data: bytes) -> bytes:
            return data * 2

        at_a, at_b = NodeMetrics(), NodeMetrics()
        at_a.watch_traffic(a.traffic)
        at_b.watch_traffic(b.traffic)
        b.subscribe("t", keep)
        b.set_handler("/twice", answer)
        await a.start()
        await b.start()
        await a.connect(b.addresses()[0])
        assert sample(at_b, "vrl_payload_bytes_total", kind=GOSSIP_IN, name="t") == 0.0
        await a.publish("t", bytes(40))
        async with asyncio.timeout(5):
            while not received:
                await asyncio.sleep(0.01)
        assert await a.request(b.peer_id, "/twice", bytes(7)) == bytes(14)
        assert sample(at_b, "vrl_payload_bytes_total", kind=GOSSIP_IN, name="t") == 40.0
        assert sample(at_b, "vrl_payload_messages_total", kind=GOSSIP_IN, name="t") == 1.0
        assert sample(at_a, "vrl_payload_bytes_total", kind=GOSSIP_OUT, name="t") == 40.0
        assert sample(at_a, "vrl_payload_bytes_total", kind=GOSSIP_IN, name="t") == 0.0  # its own publish
        assert sample(at_b, "vrl_payload_bytes_total", kind=REQUEST_IN, name="/twice") == 7.0
        assert sample(at_a, "vrl_payload_bytes_total", kind=RESPONSE_IN, name="/twice") == 14.0
        await a.close()
        await b.close()

    asyncio.run(scenario())


def test_the_model_thread_counts_what_a_job_ran_apart_from_its_wait_in_the_queue() -> None:
    def spin(seconds: float) -> None:
        end = time.thread_time() + seconds
        while time.thread_time() < end:
            pass

    async def scenario(metrics: NodeMetrics) -> None:
        thread = ModelThread(metrics)
        try:
            # The check is queued behind a 0.3 s job: it waits that long, and runs 0.05 s of CPU.
            await asyncio.gather(thread.run("train", time.sleep, 0.3), thread.run("check", spin, 0.05))
        finally:
            thread.shutdown()

    metrics = NodeMetrics()
    asyncio.run(scenario(metrics))
    # From submission, step_seconds holds the 0.3 s wait behind the sleep; what the check ran does not.
    waited = sample(metrics, "vrl_step_seconds_sum", kind="check") - sample(metrics, "vrl_work_seconds_total",
                                                                             kind="check")
    assert waited >= 0.29
    assert sample(metrics, "vrl_work_seconds_total", kind="check") >= 0.05
    assert sample(metrics, "vrl_work_cpu_seconds_total", kind="check") >= 0.05
    assert sample(metrics, "vrl_work_cpu_seconds_total", kind="train") < 0.1  # asleep: wall time, no CPU
    assert sample(metrics, "vrl_work_seconds_total", kind="train") >= 0.3
