"""The node daemon: the thin I/O around :class:`vrl.node.protocol.NodeProtocol`.

It owns the transport, the store, the clock, and the wiring of the node's collaborators,
each a room of its own that never refers back to the node: the gossip validator
(:mod:`vrl.node.validation`), the decoded-group caches (:mod:`vrl.node.groups`), the blob
files (:mod:`vrl.node.blobs`), backfill and the store's replay (:mod:`vrl.node.catchup`),
the zk duties and the prover process (:mod:`vrl.node.proving`), the trainer's duties and the
replay of its steps (:mod:`vrl.node.training`), and the model thread (:mod:`vrl.node.work`).
Incoming messages are validated (cheap checks, before gossip forwards them), stored, then fed
to the protocol; the protocol's actions are carried out here, by the collaborator each is for,
whose resulting events are fed back. Its own messages are stored before they are published,
so nothing acknowledged is ever lost to a crash, and a restart replays the store into a fresh
protocol and catches up on the rest by backfill from peers.
"""

from __future__ import annotations

import asyncio
import random
import time
from collections.abc import AsyncIterator, Callable, Coroutine
from typing import TYPE_CHECKING, Any, Protocol, Self, TypeVar

import structlog
import torch

from p2p.transport import Message, Transport, TransportError, Validation, message_id
from vrl.config import as_kwargs
from vrl.node import committee, deltas, startup
from vrl.node import protocol as P
from vrl.node.blobs import MAX_WEIGHTS_BYTES, Blobs
from vrl.node.catchup import BACKFILL_PROTOCOL, Backfill, replay_store
from vrl.node.config import NodeConfig
from vrl.node.events import FetchEntries, FetchGroup, Send
from vrl.node.groups import GroupCache
from vrl.node.messages import (
    TOPIC_GROUPS,
    TOPIC_MANIFESTS,
    TOPIC_POLICIES,
    TOPIC_STEPS,
    TOPIC_VERDICTS,
    BatchFile,
    MessageError,
    PolicyAnnouncement,
    RoundManifest,
    SignedVerdict,
    StepOutcome,
    StepVerdict,
    Submission,
    topic_of,
)
from vrl.node.metrics import NodeMetrics
from vrl.node.proving import SAMPLING_PROTOCOL, Proving, private_setup, sampling_setup
from vrl.node.requests import BACKFILL_MAX_MESSAGE_BYTES, EntriesAnswer, EntriesRequest, GroupRequest
from vrl.node.storage import Pruner
from vrl.node.store import Store
from vrl.node.training import StepReplay, Training
from vrl.node.validation import Validator
from vrl.node.work import ModelThread, PolicyTrainer, Work, WorkConfig
from vrl.rollouts.keys import NodeKey
from vrl.rollouts.record import round_seed
from vrl.rollouts.verify import Expectations, Reason
from vrl.tasks import TaskList

if TYPE_CHECKING:
    from vrl.zk import AnswerKey


class _Decodes(Protocol):
    @classmethod
    def from_bytes(cls, data: bytes) -> Self: ...


R = TypeVar("R", bound=_Decodes)

__all__ = ["BACKFILL_PROTOCOL", "ENTRIES_PROTOCOL", "GROUP_PROTOCOL", "SAMPLING_PROTOCOL", "SEND_PROTOCOL", "Node"]

# The committee design's routing (specs/network.md §3.5): a message sent to one node, and a
# group fetched by its digest; and the topics a sent message may be of.
SEND_PROTOCOL = "/vrl/send/1"
GROUP_PROTOCOL = "/vrl/group/1"
ENTRIES_PROTOCOL = "/vrl/entries/1"  # a paged manifest's entries (specs/committee.md §3.5)
SENT_TOPICS = (TOPIC_GROUPS, TOPIC_VERDICTS)
# A fetch by digest asks the trainer, then at most this many other peers drawn at random for
# each attempt (each at most DIRECT_TIMEOUT_SECONDS): a group its trainer does not hold is rarely
# anywhere else than with its producer and its committee; the protocol asks again at a later
# tick while the group is fresh, and a fresh draw then reaches other holders. In node id order,
# as before, every attempt of every node asked the same lowest ids: while a loaded trainer
# answered nothing (a 12-node devnet on 2 cores, bench/results/devnet-committee-loaded.json), a
# replayer never reached the peers that held the group.
FETCH_PEERS = 4
# A direct message or a fetch: the backfill's per-page wait (vrl.node.catchup), for one message.
DIRECT_TIMEOUT_SECONDS = 10.0

TICK_SECONDS = 0.25
# A failed policy fetch is asked again after a wait that doubles with each failure of that
# version, from 0.5 s up to 30 s, drawn at random below it ("full jitter": AWS Architecture
# Blog, "Exponential Backoff And Jitter", 2015), so that the nodes a trainer's outage failed
# do not all ask again at once. Asked again every tick instead, a node of the 12-node committee
# devnet failed 416 fetches in about a minute, each opening streams to its peers
# (bench/results/devnet-committee.json).
FETCH_RETRY_FIRST_SECONDS = 0.5
FETCH_RETRY_MAX_SECONDS = 30.0


def retry_delay(failures: int, draw: Callable[[float, float], float]) -> float:
    """Seconds to wait before asking again after ``failures`` (>= 1) failed fetches in a row:
    ``draw(0, min(FETCH_RETRY_MAX_SECONDS, FETCH_RETRY_FIRST_SECONDS x 2^(failures - 1)))``."""
    ceiling = FETCH_RETRY_MAX_SECONDS if failures > 16 else min(
        FETCH_RETRY_MAX_SECONDS, FETCH_RETRY_FIRST_SECONDS * 2 ** (failures - 1))
    return draw(0.0, ceiling)
# Gossip is best effort (drops, partitions, a frozen peer, and py-libp2p silently dropping
# what a busy peer's full queue cannot take: measured here, one worker of five lost 36 of 80
# groups to it in a 20-round devnet). Every this many seconds a node pages through every
# peer's log of the last two rounds and keeps what it lacked.
BACKFILL_EVERY_SECONDS = 5.0


class Node:
    """One node. ``await node.run(stop)`` until ``stop`` is set."""

    def __init__(self, config: NodeConfig, transport: Transport, key: NodeKey,
                 log: structlog.BoundLogger | None = None, work: Callable[..., Work] = Work,
                 trainer: Callable[..., PolicyTrainer] = PolicyTrainer) -> None:
        """``work`` makes the node's model work and ``trainer`` its trainer role: honest
        :class:`~vrl.node.work.Work` and :class:`~vrl.node.work.PolicyTrainer`, or a cheat's,
        for a node configured to cheat (:func:`vrl.harness.adversary.node_for` builds those).
        The checks of the config that need the model or the task set are
        :mod:`vrl.node.startup`'s."""
        self.config, self.transport, self.key = config, transport, key
        self.log = (log or structlog.get_logger()).bind(node=key.node_id.hex()[:8])
        self.metrics = NodeMetrics()
        self.metrics.watch_traffic(transport.traffic)
        self.store = Store(config.path / "node.sqlite")
        self.store.claim(key.node_id)
        self.blobs = Blobs(config.path / "blobs", transport, bytes.fromhex(config.trainer), self.log)
        self.pruner = Pruner(config.storage, self.store, self.blobs.directory, self.blobs.pins,
                             keep=config.protocol.max_staleness + 1, log=self.log)
        self.tasks, self.private = startup.open_tasks(config, self.log)
        # A network of private tasks (specs/zk.md §11): the trainer holds the answer key and
        # proves each trained record's correctness; every node checks those proofs.
        private_tasks = self.tasks if self.private and isinstance(self.tasks, TaskList) else None
        self.answer_key: AnswerKey | None = None
        self.answer_key, reward_proofs = (private_setup(config, private_tasks) if private_tasks is not None
                                          else (None, None))
        startup.check_reward(config, self.private)
        self.reward_spec = config.work.reward_spec  # checked when the config was made
        torch.set_num_threads(config.torch_threads)
        # The node.toml's tables go through as they are: each is its library's config.
        self.work = work(key, WorkConfig(**as_kwargs(config.work), tasks=self.tasks,
                                         groups_per_round=config.protocol.groups_per_round,
                                         hidden_states=config.zk.hidden_states), self._expectations)
        startup.check_context(config, self.work, self.log)
        self.protocol = startup.protocol_for(config, key, self.work)
        self.trainer: PolicyTrainer | None = None
        if "trainer" in config.roles:
            self.trainer = trainer(
                startup.train_config(config, self.work.max_new_tokens), config.path / "trainer", key,
                # The tasks this node read once: the trainer trains on what its checks expect,
                # even if the file changes on disk meanwhile (a private set's answers opened).
                tasks=self.tasks if self.answer_key is None or private_tasks is None else TaskList(
                    private_tasks.name, tuple(self.answer_key.opened(private_tasks.tasks))))
        startup.check_cheat(config, self.work, self.trainer)
        sampling = (sampling_setup(config, self.work.skeleton)
                    if config.zk.hidden_states or config.zk.sampling_positions else None)
        # The collaborators: each is handed what it uses, never the node.
        self.model_thread = ModelThread(self.metrics)
        self.groups = GroupCache(self.store, self.log)
        self.validate = Validator(self.protocol, config.work.group_size, self.groups, self.metrics)
        # Failed fetches in a row by policy version (retry_delay), of weights and of batch files;
        # versions no fresh group can use are dropped, so at most max_staleness + 2 entries each.
        self._fetch_failures: dict[int, int] = {}
        self._batch_failures: dict[int, int] = {}
        self.catchup = Backfill(transport, self.store, self.validate, self.log, waits=self.validate.waits,
                                committee=(bytes.fromhex(config.trainer), key.node_id) if self.protocol.design.manifests
                                else None)
        self.proving = Proving(config.zk, config.path, key, transport, self.work, self.groups, self.blobs,
                               self.model_thread, self.metrics, self.log, sampling=sampling, rewards=reward_proofs,
                               answer_key=self.answer_key)
        self.training = None if self.trainer is None else Training(
            self.trainer, key, self.work, self.protocol, self.store, self.groups, self.blobs, self.proving,
            self.model_thread, self.metrics, self.log, keep=config.protocol.max_staleness + 1)
        self.steps = StepReplay(self.protocol, self.work, self.groups, self.blobs, self.proving, self.model_thread,
                                self.metrics, self.log, private=self.private)
        self._tasks: set[asyncio.Task[object]] = set()
        self._stopping = False
        self._feeding = 0  # events whose actions are under way (_feed)
        self._reputation_round: int | None = None

    def _expectations(self, version: int) -> Expectations:
        policy = self.protocol.policies[version]
        return Expectations(tasks=self.tasks, round_seed=round_seed(policy.model_hash, version),
                            sampling=self.work.sampling, reward_spec=self.reward_spec,
                            correctness_later=self.private)

    def _spawn(self, coroutine: Coroutine[Any, Any, object]) -> asyncio.Task[object]:
        task = asyncio.create_task(coroutine)
        self._tasks.add(task)
        task.add_done_callback(self._finished)
        return task

    def _finished(self, task: asyncio.Task[object]) -> None:
        self._tasks.discard(task)
        if not task.cancelled() and task.exception() is not None:
            self.log.error("task failed", error=repr(task.exception()))

    async def _events(self, events: AsyncIterator[P.Event]) -> None:
        """Feed a collaborator's events as they come: it goes on once each is acted on."""
        async for event in events:
            await self._feed(event)

    # -- incoming ------------------------------------------------------------------------------
    async def _on_message(self, message: Message) -> None:
        """A gossip message the transport already ran :attr:`validate` on, fed as its event.
        What is stored of it is the protocol's call, by its Persist actions."""
        if self._stopping:
            return  # the transport may still deliver while the node shuts down
        now = time.time()
        if message.topic == TOPIC_GROUPS:
            await self._feed(P.GroupReceived(self.groups.group_of(message.msg_id, message.data), now))
        elif message.topic == TOPIC_VERDICTS:
            await self._feed(P.VerdictReceived(SignedVerdict.from_bytes(message.data)))
        elif message.topic == TOPIC_POLICIES:
            await self._feed(P.PolicyAnnounced(PolicyAnnouncement.from_bytes(message.data)))
        elif message.topic == TOPIC_STEPS:
            await self._feed(P.StepVerdictReceived(StepVerdict.from_bytes(message.data)))
        elif message.topic == TOPIC_MANIFESTS:
            await self._feed(P.ManifestReceived(RoundManifest.from_bytes(message.data), now))

    async def _feed(self, event: P.Event) -> None:
        # While an event's actions are being done (a Publish awaits the network), the
        # protocol's reputation already counts verdicts the store does not hold yet: no
        # snapshot is taken then (_export_reputation), so that an auditor replaying the
        # verdicts stored by the snapshot's time gets the snapshot (specs/audit.md §3).
        self._feeding += 1
        try:
            for action in self.protocol.handle(event):
                await self._do(action)
        finally:
            self._feeding -= 1
        self.pruner.after(self.protocol.policies, self.protocol.version)  # a new version: the tier's prune

    # -- actions -------------------------------------------------------------------------------
    async def _do(self, action: P.Action) -> None:
        match action:
            case P.Publish(topic, data):
                await self._publish(topic, data)
            case Send(peer, topic, data):
                self._store_own(topic, data)  # acknowledged before it leaves, as a publish is
                self._spawn(self._send(peer, topic, data))
            case FetchGroup(digest, version):
                self._spawn(self._fetch_group(digest, version))
            case P.FetchPolicy(announcement):
                self._spawn(self._fetch_policy(announcement))
            case P.FetchBatch(announcement):
                self._spawn(self._fetch_batch(announcement))
            case P.Generate(version):
                self._spawn(self._generate(version))
            case P.Check(group, version):
                self._spawn(self._check(group, version))
            case P.Plant(version):
                self._spawn(self._plant(version))
            case P.Train(version, batch):
                if self.training is None:  # the protocol asks a trainer only (its role)
                    self.log.error("a Train action on a node that is not the trainer", version=version)
                else:
                    self._spawn(self._events(self.training.train(version, batch)))
            case P.Quarantine(node, purged):
                self.log.warning("quarantined", peer=node.hex()[:8], purged_groups=len(purged))
            case P.PersistGroup(group, received):
                if self.groups.persist(group, received):
                    self.metrics.groups_received.inc()
            case P.PersistPolicy(announcement):
                self.store.put_policy(announcement, time.time())
            case P.Persist(verdict):
                if self.store.put_verdict(verdict, time.time()):
                    self.metrics.verdicts.labels(verdict.outcome).inc()
            case P.PersistManifest(manifest, lists):
                if self.store.put_manifest(manifest, time.time(), lists):
                    self.log.info("round manifest", round=manifest.round, groups=manifest.groups,
                                  eligible=manifest.weights)
            case FetchEntries():
                self._spawn(self._fetch_entries(action))
            case P.ReplayStep(announcement):
                self._spawn(self._events(self.steps.replay(announcement)))
            case P.PersistStep(verdict):
                self.store.put_step(verdict, time.time())
                if verdict.verifier == self.key.node_id:  # its own pass, stored not gossiped (committees)
                    self._judged(verdict)
                elif verdict.outcome == StepOutcome.FRAUD:
                    self.log.warning("step reported as fraud", version=verdict.version,
                                     reporter=verdict.verifier.hex()[:8], reasons=list(verdict.reasons))
            case P.ConvictTrainer(trainer, version, reasons, reporters):
                self.metrics.trainer_convicted.set(1)
                self.metrics.trainer_fraud_version.set(version)
                self.log.critical("TRAINER FRAUD CONFIRMED: following none of its versions from this one on",
                                  trainer=trainer.hex()[:8], version=version, reasons=list(reasons),
                                  reporters=[r.hex()[:8] for r in reporters])
            case _:  # an action a newer protocol added and this daemon does not carry out: never silent
                self.log.error("action not carried out by this daemon", action=type(action).__name__)

    async def _publish(self, topic: str, data: bytes) -> None:
        """Own messages are stored first (acknowledged), then gossiped; delivery to ourselves
        comes back through :meth:`_on_message`, where storing again is a no-op."""
        if self._stopping:
            return
        self._store_own(topic, data)
        try:
            await self.transport.publish(topic, data)
        except TransportError as error:
            self.log.warning("publish failed; peers will backfill it", topic=topic, error=str(error))

    async def _send(self, peer: bytes, topic: str, data: bytes) -> None:
        """A message to one node (specs/network.md §3.5), already stored: a failed send is left to
        the receiver's backfill, which pages in this node's log."""
        try:
            await self.transport.request(peer, SEND_PROTOCOL, data, timeout=DIRECT_TIMEOUT_SECONDS)
        except TransportError as error:
            self.log.warning("send failed; the receiver will backfill it", topic=topic, peer=peer.hex()[:8],
                             error=str(error))

    async def _serve_send(self, peer: bytes, data: bytes) -> bytes:
        """A message sent to this node: validated exactly as a gossiped one of its topic, then
        handled; forwarded to no one. A message the validator rejects counts against its sender."""
        topic = topic_of(data)
        if topic not in SENT_TOPICS:
            self.transport.penalize(peer)
            raise MessageError("a sent message is a group or a verdict")
        message = Message(topic, data, peer, message_id(topic, data))
        verdict = self.validate(message)
        if verdict is Validation.REJECT:
            self.transport.penalize(peer)
            raise MessageError("the sent message is invalid")
        if verdict is Validation.ACCEPT:
            await self._on_message(message)
        return b""

    def _direct_peers(self) -> list[bytes]:
        """Whom a fetch asks, in order: the trainer (it holds every group it listed and every list
        it signed), then at most FETCH_PEERS other connected peers drawn afresh each attempt."""
        trainer = bytes.fromhex(self.config.trainer)
        connected = self.transport.peers()
        others = [p for p in connected if p != trainer]
        return ([trainer] if trainer in connected else []) + random.sample(others, min(FETCH_PEERS, len(others)))

    async def _fetch_group(self, digest: bytes, version: int) -> None:
        """A group by its digest (specs/network.md §3.5): the trainer first, then peers; its bytes
        must hash to ``digest`` and pass the validator, else the peer is penalized and the next
        asked. None had it: Abandoned, and the protocol asks again later."""
        request = GroupRequest(digest, version).to_bytes()
        for peer in self._direct_peers():
            try:
                data = await self.transport.request(peer, GROUP_PROTOCOL, request, timeout=DIRECT_TIMEOUT_SECONDS,
                                                    max_response=BACKFILL_MAX_MESSAGE_BYTES)
                ours = Submission.from_bytes(data).digest == digest
            except TransportError:
                continue  # not there, or no answer: the next peer
            except MessageError:
                ours = False
            message = Message(TOPIC_GROUPS, data, peer, message_id(TOPIC_GROUPS, data))
            judged = self.validate(message) if ours else Validation.REJECT
            if judged is Validation.REJECT:
                self.transport.penalize(peer)  # an answer that is not the group asked for
                continue
            if judged is Validation.ACCEPT:
                self.metrics.backfilled.labels(TOPIC_GROUPS).inc()
                await self._on_message(message)
                return
        await self._feed(P.Abandoned(FetchGroup(digest, version)))

    async def _fetch_entries(self, action: FetchEntries) -> None:
        """Entries of a round's lists (specs/committee.md §3.5): the trainer first, then peers.
        An answer that does not decode, or that the round's header does not prove, counts
        against its peer and the next is asked; none answered: Abandoned."""
        request = EntriesRequest(action.round, committee.List(action.list), action.positions, action.keys).to_bytes()
        manifest = self.protocol.rounds.manifests.get(action.round)
        if manifest is None:  # forgotten meanwhile: nothing could prove an answer
            await self._feed(P.Abandoned(action))
            return
        for peer in self._direct_peers():
            try:
                data = await self.transport.request(peer, ENTRIES_PROTOCOL, request, timeout=DIRECT_TIMEOUT_SECONDS)
                answer = EntriesAnswer.from_bytes(data)
                committee.check_entries(manifest.header, answer.entries, action.list, action.positions, action.keys)
            except TransportError:
                continue  # not there, or no answer: the next peer
            except (MessageError, committee.CommitteeError):
                self.transport.penalize(peer)  # an answer its round's header does not prove
                continue
            await self._feed(P.EntriesReceived(action, answer))
            return
        await self._feed(P.Abandoned(action))

    def _request(self, kind: type[R], peer: bytes, data: bytes) -> R:
        """A request of ``kind`` from ``peer``: a malformed one counts against it (MessageError)."""
        try:
            return kind.from_bytes(data)
        except MessageError:
            self.transport.penalize(peer)
            raise

    async def _serve_entries(self, peer: bytes, data: bytes) -> bytes:
        """Entries of a round's lists this node holds (the trainer's); an error status else."""
        request = self._request(EntriesRequest, peer, data)
        try:
            return EntriesAnswer.of(self.protocol.rounds.answer(request)).to_bytes()
        except committee.CommitteeError as error:
            raise LookupError(error.reason) from None

    async def _serve_group(self, peer: bytes, data: bytes) -> bytes:
        """A group this node holds, by digest; an error status if it holds none."""
        request = self._request(GroupRequest, peer, data)
        submission = self.store.group(request.group)
        if submission is None:
            raise LookupError("not here")
        return submission.to_bytes()

    def _store_own(self, topic: str, data: bytes) -> None:
        """Store one of this node's own messages before it leaves (acknowledged)."""
        now = time.time()
        if topic == TOPIC_GROUPS:
            group = self.groups.group_of(message_id(topic, data), data)
            self.store.put_group(group.submission, group.subject, group.version, now,
                                 planted=group.digest in self.protocol.planted)
        elif topic == TOPIC_VERDICTS:
            verdict = SignedVerdict.from_bytes(data)
            if self.store.put_verdict(verdict, now) and not verdict.checked:
                self.metrics.skipped.inc()
        elif topic == TOPIC_POLICIES:
            self.store.put_policy(PolicyAnnouncement.from_bytes(data), now)
        elif topic == TOPIC_MANIFESTS:  # the trainer closing a round (specs/committee.md §3.4)
            manifest = RoundManifest.from_bytes(data)
            self.store.put_manifest(manifest, now)  # with its lists already (PersistManifest)
            self.log.info("round closed", round=manifest.round, groups=manifest.groups, eligible=manifest.weights)
        elif topic == TOPIC_STEPS:
            step = StepVerdict.from_bytes(data)
            self.store.put_step(step, now)
            self._judged(step)

    def _judged(self, step: StepVerdict) -> None:
        """This node's own judgement of a step, published or (a pass in the committee design)
        only stored: counted and logged alike."""
        self.metrics.steps_replayed.labels(step.outcome).inc()
        (self.log.error if step.reasons else self.log.info)(
            "step judged", version=step.version, outcome=str(step.outcome), reasons=list(step.reasons),
            drift=step.drift)

    async def _fetch_policy(self, announcement: PolicyAnnouncement) -> None:
        try:
            # From its delta when this node holds the parent's file (specs/network.md §6.1), else whole.
            blob = await deltas.fetch_weights(self.blobs, announcement, min(announcement.size, MAX_WEIGHTS_BYTES),
                                              self.model_thread.run, self.log)
            await self.model_thread.run("load", self.work.load, announcement, blob,
                                        self.config.protocol.max_staleness + 1)
        except Exception as error:  # a failed fetch is retried by the protocol's next pending()
            await self._fetch_failed(self._fetch_failures, "policy", P.FetchPolicy(announcement), error)
            return
        self._fetch_failures.pop(announcement.version, None)
        self.metrics.policy_version.set(announcement.version)
        self.log.info("policy loaded", version=announcement.version, model_hash=announcement.model_hash.hex()[:16])
        await self._feed(P.PolicyLoaded(announcement.version))

    async def _fetch_failed(self, failures: dict[int, int], what: str, action: P.FetchPolicy | P.FetchBatch,
                            error: Exception) -> None:
        """A fetch of ``action``'s version failed: reported Abandoned after retry_delay's
        back-off for its failures in a row, so a fetch that fails at once does not spin."""
        version = action.announcement.version
        oldest = version - self.config.protocol.max_staleness - 1
        for stale in [v for v in failures if v < oldest]:
            del failures[stale]
        failures[version] = failures.get(version, 0) + 1
        wait = retry_delay(failures[version], random.uniform)
        self.log.warning(f"{what} fetch failed", version=version, error=repr(error), failures=failures[version],
                         retry_in=round(wait, 2))
        await asyncio.sleep(wait)  # this fetch's task only: the node's loop goes on
        await self._feed(P.Abandoned(action))

    async def _fetch_batch(self, announcement: PolicyAnnouncement) -> None:
        """The batch file a step's announcement names (specs/network.md §3.3.1), for judging
        the step: hash-checked by the blob fetch, then decoded against the announcement. A file
        that is no batch of it is the trainer's fault (BatchFetched with no batch)."""
        try:
            data = await self.blobs.get(announcement.batch_file, announcement.batch_size,
                                        f"batch of version {announcement.version}")
        except Exception as error:  # not served yet, or by no peer: asked again by the protocol
            await self._fetch_failed(self._batch_failures, "batch file", P.FetchBatch(announcement), error)
            return
        self._batch_failures.pop(announcement.version, None)
        try:
            batch = BatchFile.of(announcement, data)
        except MessageError as error:
            batch = None
            self.log.error("the batch file a policy names is not its batch", version=announcement.version,
                           reason=str(error))
        await self._feed(P.BatchFetched(announcement, batch))

    async def _generate(self, version: int) -> None:
        groups = await self.model_thread.run("generate", self.work.generate, version)
        for group in groups:  # signed here, so stored and published without decoding them again
            self.groups.remember(message_id(TOPIC_GROUPS, group.to_bytes()), group)
        await self.proving.keep_rows(groups)  # on disk before the groups are published
        self.metrics.rollouts_produced.inc(sum(len(g.rollouts) for g in groups))
        self.log.info("generated", version=version, groups=len(groups))
        await self._feed(P.Generated(version, tuple(groups)))

    async def _check(self, digest: bytes, version: int) -> None:
        """Check a group; whatever goes wrong, the protocol hears of it: a check that neither
        ended nor was abandoned would hold one of its check queue's slots for good."""
        try:
            await self._check_group(digest, version)
        except asyncio.CancelledError:
            raise
        except Exception as error:
            self.log.error("check could not run; left for later", group=digest.hex()[:12], error=repr(error))
            await self._later(digest, version)

    async def _later(self, digest: bytes, version: int) -> None:
        """A check that cannot run now is reported abandoned, and the protocol asks for it again,
        after the back-off of a failed fetch for its abandons in a row: one that cannot run at
        once every time (no body yet, weights still loading, its producer out of reach) would
        otherwise be asked, abandoned and asked again in a loop while nothing else waits."""
        await asyncio.sleep(retry_delay(self.protocol.abandoned_checks[digest] + 1, random.uniform))
        if not self._stopping:  # (this check's task only sleeps: the node's loop goes on)
            await self._feed(P.Abandoned(P.Check(digest, version)))

    async def _check_group(self, digest: bytes, version: int) -> None:
        group = self.groups.body(digest)
        # A check that will ask its producer for proofs waits until the producer is connected,
        # before any prefill (specs/network.md §3.4).
        unreached = (group is not None and self.config.zk.sampling_positions > 0
                     and group.subject not in self.transport.peers())
        if group is None or version not in self.work.models or unreached:
            await self._later(digest, version)
            return
        result = await self.model_thread.run("check", self.work.check, group, version)
        reasons = result.reasons
        if not reasons and self.config.zk.sampling_positions:
            challenged = await self.proving.challenge(group, version)
            if challenged is None:  # not asked after all; the protocol asks for the check again
                await self._later(digest, version)
                return
            reasons = challenged
        if Reason.REWARD_UNKNOWN in reasons:
            # This machine could not compute the reward just now (its sandbox could not start: a
            # full disk, no process to spare): its own limit, not the producer's fault. No
            # verdict; the protocol asks for the check again (specs/rewards.md §6).
            self.log.warning("reward not computable here; check left for later", group=digest.hex()[:12])
            await self._later(digest, version)
            return
        outcome = P.outcome_of(reasons)
        self.metrics.checks.labels(outcome).inc()
        for reason in reasons:
            self.metrics.rejected.labels(reason).inc()
        if reasons:
            self.log.warning("check failed", group=digest.hex()[:12], reasons=sorted(set(reasons)))
        await self._feed(P.Checked(digest, reasons, result.digest, result.race_tokens, result.races_lost))

    async def _plant(self, version: int) -> None:
        submission, canary = await self.model_thread.run("plant", self.work.plant, version)
        self.log.info("planted a known-bad group", group=submission.digest.hex()[:12], canary=canary.hex()[:8])
        await self._feed(P.Planted(submission, canary, version))

    # -- catching up ---------------------------------------------------------------------------
    async def backfill(self, since: int | None = None) -> int:
        """Ask every connected peer for what gossip did not bring (this node was away, a
        partition, a drop, a clogged link) of rounds ``>= since``; returns the number of
        messages it had not stored before, handled as gossip is."""
        if since is None:
            since = max((self.protocol.version or 0) - self.config.protocol.max_staleness, 0)
        fed = 0
        async for message in self.catchup.pull(since):
            await self._on_message(message)
            self.metrics.backfilled.labels(message.topic).inc()
            fed += 1
        self.metrics.backfill_waiting.set(len(self.catchup.deferred))
        return fed

    # -- life cycle ----------------------------------------------------------------------------
    async def run(self, stop: asyncio.Event) -> None:
        replay_store(self.store, self.protocol)
        # The clock before anything is announced (the trainer's bootstrap announces version 0):
        # a round starts at the time it is announced, not at 0, or the committee design's
        # submission window (specs/committee.md §3.4) would close round 0 at the first tick,
        # empty. Replaying: no actions, only the time.
        self.protocol.handle(P.Tick(time.time()), replaying=True)
        self.log.info("replayed store", **self.store.counts(), version=self.protocol.version)
        self.pruner.reconcile(self.protocol.policies, self.protocol.version)  # a prune a crash cut short
        topics = (TOPIC_POLICIES, TOPIC_GROUPS, TOPIC_VERDICTS, TOPIC_STEPS)
        # The committee design's round manifests (specs/committee.md §3.3), before any verdict
        # of their rounds can count; a ticket network has none.
        for topic in topics + ((TOPIC_MANIFESTS,) if self.protocol.design.manifests else ()):
            self.transport.subscribe(topic, self._on_message, self.validate)
        self.transport.set_handler(BACKFILL_PROTOCOL, self.catchup.serve)
        if self.protocol.design.manifests:  # specs/network.md §3.5
            self.transport.set_handler(SEND_PROTOCOL, self._serve_send, max_request=BACKFILL_MAX_MESSAGE_BYTES)
            self.transport.set_handler(GROUP_PROTOCOL, self._serve_group)
            self.transport.set_handler(ENTRIES_PROTOCOL, self._serve_entries)
        if self.config.zk.hidden_states:
            self.transport.set_handler(SAMPLING_PROTOCOL, self.proving.serve_sampling)
        if self.config.metrics_port:
            port = self.metrics.serve(self.config.metrics_port)
            self.log.info("metrics", url=f"http://127.0.0.1:{port}/metrics")
        await self.connect_bootstrap()
        await self.backfill()
        if self.training is not None:
            await self._events(self.training.bootstrap())
        last_backfill, backfilling = time.monotonic(), None
        try:
            while not stop.is_set():
                await self._feed(P.Tick(time.time()))
                # One pass at a time: a peer that answers slowly must not pile passes up.
                if time.monotonic() - last_backfill > BACKFILL_EVERY_SECONDS and (
                        backfilling is None or backfilling.done()):
                    last_backfill = time.monotonic()
                    backfilling = self._spawn(self.backfill(since=max((self.protocol.version or 0) - 1, 0)))
                self._export_reputation()
                try:
                    await asyncio.wait_for(stop.wait(), TICK_SECONDS)
                except TimeoutError:
                    pass
        finally:
            self._stopping = self.proving.stopping = True
            for task in list(self._tasks):
                task.cancel()
            await asyncio.gather(*self._tasks, return_exceptions=True)
            self.model_thread.shutdown()
            if self.training is not None:
                self.training.close()
            self.proving.close()
            self.store.close()

    async def connect_bootstrap(self, attempts: int = 20) -> None:
        """Dial every bootstrap address, retrying a bounded number of times (peers start in any order)."""
        for address in self.config.bootstrap:
            for attempt in range(attempts):
                try:
                    await self.transport.connect(address)
                    break
                except TransportError as error:
                    if attempt == attempts - 1:
                        self.log.warning("bootstrap peer unreachable", address=address, error=str(error))
                    await asyncio.sleep(min(0.25 * 2 ** attempt, 2.0))

    def _export_reputation(self) -> None:
        version = self.protocol.version or 0
        standings = self.protocol.reputation.standings(version)
        self.metrics.peers.set(len(self.transport.peers()))
        for node, s in standings.items():
            peer = node.hex()[:8]
            self.metrics.reputation.labels(peer).set(s.score)
            self.metrics.check_rate.labels(peer).set(s.check_rate)
            self.metrics.quarantined.labels(peer).set(int(s.quarantined))
        if (self.protocol.version is not None and version != self._reputation_round
                and not self._feeding):  # else the next tick takes it
            self._reputation_round = version
            self.store.put_reputation(version, [(n, s.score, s.check_rate, s.quarantined, s.trust, s.checked_groups)
                                                for n, s in standings.items()], at=time.time())
