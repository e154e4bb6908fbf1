"""The libp2p transport on 127.0.0.1: gossip, request/response and blob numbers.

    python bench/network.py              # 5 peers; 200 x 2 KiB gossip at 20 msg/s, then as a burst
    python bench/network.py --rate 50

Prints one table:
* gossip from one peer, paced by the caller at ``--rate`` and as one burst of concurrent
  publishes (the transport paces those itself): the share of (message, subscriber) pairs
  delivered, and publish-to-delivery latency p50/p99;
* a 1 KiB request/response, one at a time: latency p50/p99;
* an 8 MiB blob fetched by ``p2p.blobs.fetch_blob``: throughput.

One process per peer, as a node runs: this process is peer 0 (the publisher and client), the
others run this file with ``--peer``. Latency is measured on CLOCK_MONOTONIC, which all
processes share. The topology: peer i dials i+1 and i+3 (``dial_neighbours``), about four links
each (with 5 peers, every other peer), enough for GossipSub's D_low = 4 (p2p/libp2p_transport.py).
On a shared 2-core machine the numbers are noisy.
Every phase has a deadline and the peers exit by themselves; a run takes well under 2 minutes.
"""

from __future__ import annotations

import argparse
import asyncio
import hashlib
import json
import random
import socket
import statistics
import struct
import sys
import time
from collections import defaultdict

from cryptography.hazmat.primitives.asymmetric.ed25519 import Ed25519PrivateKey
from rich.console import Console
from rich.table import Table

from p2p.blobs import BlobStore, fetch_blob
from p2p.libp2p_transport import Libp2pTransport, multiaddr_for
from p2p.transport import Message, TransportError

PEERS = 5
MESSAGES = 200
MESSAGE_BYTES = 2048
REQUESTS = 200
REQUEST_BYTES = 1024
BLOB_BYTES = 8 << 20
BLOB_FETCHES = 3
TOPIC = "bench"
PEER_LIFETIME = 110.0  # seconds a --peer process lives at most
_STAMP = struct.Struct(">8sd")  # run tag, CLOCK_MONOTONIC when published


def seed(index: int) -> bytes:
    return hashlib.sha256(b"bench-peer-%d" % index).digest()


def blob_data() -> bytes:
    return random.Random(0).randbytes(BLOB_BYTES)


def percentile(values: list[float], q: int) -> float:
    if len(values) < 2:
        return values[0] if values else float("nan")
    return statistics.quantiles(values, n=100, method="inclusive")[q - 1]


async def echo(peer: bytes, data: bytes) -> bytes:
    return data


def peer_id(index: int) -> bytes:
    return Ed25519PrivateKey.from_private_bytes(seed(index)).public_key().public_bytes_raw()


def address(index: int, ports: list[int]) -> str:
    return multiaddr_for(peer_id(index), "127.0.0.1", ports[index])


async def dial_neighbours(transport: Libp2pTransport, index: int, ports: list[int]) -> None:
    """Dial peers i+1 and i+3, retrying while they start (at most 30 s)."""
    for step in (1, 3):
        neighbour = (index + step) % PEERS
        for _ in range(60):
            try:
                await transport.connect(address(neighbour, ports))
                break
            except TransportError:
                await asyncio.sleep(0.5)
        else:
            raise TransportError(f"peer {index} could not reach peer {neighbour}")


async def run_peer(index: int, ports: list[int]) -> None:
    """A subscriber: notes the latency of each message and reports them on request."""
    transport = Libp2pTransport(seed(index), port=ports[index])
    latencies: dict[str, list[float]] = defaultdict(list)

    async def on_message(message: Message) -> None:
        tag, sent = _STAMP.unpack_from(message.data)
        latencies[tag.rstrip(b"\0").decode()].append(time.monotonic() - sent)

    async def report(peer: bytes, tag: bytes) -> bytes:
        return json.dumps(latencies.get(tag.decode(), [])).encode()

    transport.subscribe(TOPIC, on_message)
    transport.set_handler("/echo", echo)
    transport.set_handler("/report", report)
    if index == 1:
        BlobStore(transport).put(blob_data())
    await transport.start()
    try:
        await dial_neighbours(transport, index, ports)
        print("ready", flush=True)
        await asyncio.sleep(PEER_LIFETIME)
    finally:
        await transport.close()


class Bench:
    def __init__(self, rate: float) -> None:
        self.rate = rate
        self.ports = [free_port() for _ in range(PEERS)]
        self.me = Libp2pTransport(seed(0), port=self.ports[0])
        self.others: list[bytes] = []
        self.store = blob_data()

    async def run(self) -> list[tuple[str, str]]:
        async def ignore(message: Message) -> None:
            pass

        self.me.subscribe(TOPIC, ignore)
        await self.me.start()
        processes = []
        try:
            started = time.monotonic()
            for index in range(1, PEERS):
                processes.append(await asyncio.create_subprocess_exec(
                    sys.executable, __file__, "--peer", str(index), "--ports", ",".join(map(str, self.ports)),
                    stdout=asyncio.subprocess.PIPE, stderr=asyncio.subprocess.DEVNULL))
            await dial_neighbours(self.me, 0, self.ports)
            for process in processes:
                assert await asyncio.wait_for(process.stdout.readline(), 60) == b"ready\n", "a peer failed"
            self.others = [peer_id(index) for index in range(1, PEERS)]
            up_s = time.monotonic() - started
            mesh_s = await self.wait_for_mesh()
            paced = await self.gossip("paced", self.rate)
            burst = await self.gossip("burst", None)
            rr = await self.requests()
            blob = await self.blob()
        finally:
            for process in processes:
                if process.returncode is None:
                    process.kill()
                    await process.wait()
            await self.me.close()
        return [
            ("peers (processes) / links", f"{PEERS} / {2 * PEERS}: up in {up_s:.1f} s, meshed {mesh_s:.1f} s later"),
            (f"gossip {MESSAGES} x {MESSAGE_BYTES} B at {self.rate:g}/s: delivered",
             f"{100 * paced['delivered']:.1f} % of {MESSAGES} x {PEERS - 1}"),
            ("  latency p50 / p99", f"{paced['p50_ms']:.1f} / {paced['p99_ms']:.1f} ms"),
            (f"gossip {MESSAGES} x {MESSAGE_BYTES} B burst: delivered",
             f"{100 * burst['delivered']:.1f} % (publishes returned at {burst['publish_per_s']:.0f}/s)"),
            ("  latency p50 / p99", f"{burst['p50_ms']:.1f} / {burst['p99_ms']:.1f} ms"),
            (f"request {REQUEST_BYTES} B, one at a time: latency p50 / p99",
             f"{rr['p50_ms']:.2f} / {rr['p99_ms']:.2f} ms ({rr['per_s']:.0f} req/s)"),
            (f"blob {BLOB_BYTES >> 20} MiB in 1 MiB chunks, median of {BLOB_FETCHES}",
             f"{blob['mb_per_s']:.0f} MB/s ({blob['seconds']:.2f} s)"),
        ]

    async def latencies(self, tag: str) -> list[list[float]]:
        return [json.loads(await self.me.request(peer, "/report", tag.encode())) for peer in self.others]

    async def wait_for_mesh(self) -> float:
        """Probe until every peer has heard one: the mesh forms on a heartbeat (1 s)."""
        started = time.monotonic()
        for _ in range(100):
            await self.me.publish(TOPIC, _STAMP.pack(b"probe", time.monotonic()))
            if all(await self.latencies("probe")):
                return time.monotonic() - started
            await asyncio.sleep(0.1)
        raise AssertionError("the mesh never formed")

    async def gossip(self, tag: str, rate: float | None) -> dict[str, float]:
        """200 messages from this peer: at ``rate`` per second, or all at once (None)."""
        async def publish(index: int) -> None:
            padding = index.to_bytes(4, "big") + bytes(MESSAGE_BYTES - _STAMP.size - 4)
            await self.me.publish(TOPIC, _STAMP.pack(tag.encode(), time.monotonic()) + padding)

        started = time.monotonic()
        if rate is None:
            await asyncio.gather(*(publish(index) for index in range(MESSAGES)))
        else:
            for index in range(MESSAGES):
                await asyncio.sleep(max(0.0, started + index / rate - time.monotonic()))
                await publish(index)
        published = time.monotonic() - started
        deadline = time.monotonic() + 15
        while True:
            received = await self.latencies(tag)
            if all(len(values) >= MESSAGES for values in received) or time.monotonic() > deadline:
                break
            await asyncio.sleep(0.2)
        flat = [value for values in received for value in values]
        return {"delivered": len(flat) / (MESSAGES * len(received)), "p50_ms": 1000 * percentile(flat, 50),
                "p99_ms": 1000 * percentile(flat, 99), "publish_per_s": MESSAGES / published}

    async def requests(self) -> dict[str, float]:
        payload = bytes(REQUEST_BYTES)
        seconds = []
        for _ in range(REQUESTS):
            started = time.monotonic()
            await self.me.request(self.others[0], "/echo", payload)
            seconds.append(time.monotonic() - started)
        return {"p50_ms": 1000 * percentile(seconds, 50), "p99_ms": 1000 * percentile(seconds, 99),
                "per_s": REQUESTS / sum(seconds)}

    async def blob(self) -> dict[str, float]:
        digest = hashlib.sha256(self.store).digest()
        seconds = []
        for _ in range(BLOB_FETCHES):
            started = time.monotonic()
            assert await fetch_blob(self.me, [self.others[0]], digest, max_size=BLOB_BYTES) == self.store
            seconds.append(time.monotonic() - started)
        median = statistics.median(seconds)
        return {"mb_per_s": BLOB_BYTES / 1e6 / median, "seconds": median}


def free_port() -> int:
    with socket.socket() as probe:
        probe.bind(("127.0.0.1", 0))
        return probe.getsockname()[1]


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--rate", type=float, default=20.0, help="paced gossip, messages per second")
    parser.add_argument("--peer", type=int, help=argparse.SUPPRESS)  # run as peer N (internal)
    parser.add_argument("--ports", help=argparse.SUPPRESS)
    args = parser.parse_args()
    if args.peer is not None:
        asyncio.run(run_peer(args.peer, [int(port) for port in args.ports.split(",")]))
        return

    async def bounded() -> list[tuple[str, str]]:
        async with asyncio.timeout(110):
            return await Bench(args.rate).run()

    started = time.monotonic()
    rows = asyncio.run(bounded())
    table = Table(title=f"py-libp2p transport, 127.0.0.1, one process per peer ({time.monotonic() - started:.0f} s)")
    table.add_column("measure")
    table.add_column("result", justify="right")
    for row in rows:
        table.add_row(*row)
    Console(width=100).print(table)


if __name__ == "__main__":
    main()
