"""The node daemon: the thin I/O around :class:`vrl.node.protocol.NodeProtocol`.

It owns the transport, the store, the model thread, the clock, metrics and logs. Incoming
messages are validated (cheap checks, before gossip forwards them), stored, then fed to the
protocol; the protocol's actions are carried out here. Its own messages are stored before
they are published, so nothing acknowledged is ever lost to a crash, and a restart replays
the store into a fresh protocol and catches up on the rest by backfill from peers.
"""

from __future__ import annotations

import asyncio
import dataclasses
import functools
import hashlib
import json
import multiprocessing
import time
from collections import OrderedDict
from collections.abc import Callable
from concurrent.futures import ProcessPoolExecutor, ThreadPoolExecutor
from concurrent.futures.process import BrokenProcessPool

import structlog
import torch

from p2p.blobs import BlobStore, fetch_blob
from p2p.transport import MAX_RESPONSE_BYTES, Message, Transport, TransportError, Validation, message_id
from proofs.zk import ZkError
from vrl.config import ConfigError, as_kwargs
from vrl.node import protocol as P
from vrl.node.config import NodeConfig
from vrl.node.messages import (
    TOPIC_GROUPS,
    TOPIC_POLICIES,
    TOPIC_STEPS,
    TOPIC_VERDICTS,
    BackfillPage,
    BackfillRequest,
    Group,
    MessageError,
    PolicyAnnouncement,
    SamplingRequest,
    SignedVerdict,
    StepFault,
    StepVerdict,
    Submission,
    audit_ticket,
    decode_group,
    topic_of,
)
from vrl.node.metrics import NodeMetrics
from vrl.node.store import Store, StoreError
from vrl.node.work import CheckResult, PolicyTrainer, Screen, TrainedStep, Work, WorkConfig
from vrl.rl.step import MAX_STEP_CONFIG_BYTES, PolicyForward
from vrl.rl.train import TrainConfig
from vrl.rollouts.files import write_bytes_atomic
from vrl.rollouts.keys import NodeKey
from vrl.rollouts.model import context_length, platform_tag
from vrl.rollouts.profiles import profile_of
from vrl.rollouts.record import Rollout, round_seed
from vrl.rollouts.verify import Expectations, Reason
from vrl.tasks import TaskList, open_task_set
from vrl.tasks.answers import committed_reference
from vrl.zk.rewards import max_proofs_bytes
from vrl.zk.sampling import SamplingProofError, answer_challenge, head_weight, prover_init, write_witness

BACKFILL_PROTOCOL = "/vrl/backfill/1"
SAMPLING_PROTOCOL = "/vrl/sampling/1"
#: What one opening of a sampling answer may take (an lm-logits attachment is 14.2 KB and its
#: row 256 B, bench/results/zk.json): an answer is bounded by its group's records x positions.
MAX_OPENING_BYTES = 32 << 10
#: (peer, group) pairs a worker has answered, remembered so that each gets one answer: a peer
#: cannot make it prove one group again and again. Older ones are forgotten first.
MAX_SERVED = 4096
#: Groups whose rows a worker keeps (about 1 KiB a record on the micro preset): its own groups
#: of the last versions; with the defaults a worker makes groups_per_round (4) a version, and
#: verifiers check only max_staleness + 1 (3) versions back, so 1024 is hundreds of versions.
MAX_WITNESS_FILES = 1024
#: Seconds a worker takes to prove one position, with room: 3.2 to 3.7 s measured here
#: (bench/results/zk.json). A verifier's proof_timeout must cover a whole group's worth twice.
PROVE_SECONDS_PER_POSITION = 4.0
#: Answers a worker keeps to send again to the same verifier for the same group: a verifier
#: whose own check of an answer failed asks again (specs/network.md §3.4). An answer is at most
#: 2 MiB, so 64 of them bound the cache at 128 MiB.
MAX_KEPT_ANSWERS = 64
BACKFILL_PAGE_BYTES = 1 << 20  # under the transport's 2 MiB response cap
BACKFILL_MAX_PAGES = 64  # bounded catch-up per peer; the rest arrives by gossip
TICK_SECONDS = 0.25
# Gossip is best effort (drops, partitions, a frozen peer, and py-libp2p silently dropping
# what a busy peer's full queue cannot take: measured here, one worker of five lost 36 of 80
# groups to it in a 20-round devnet). Every this many seconds a node pages through every
# peer's log of the last two rounds and keeps what it lacked.
BACKFILL_EVERY_SECONDS = 5.0
MAX_WEIGHTS_BYTES = 2 << 30
# An optimizer state file is AdamW's two moments: twice the weights, plus a step count each.
MAX_OPTIMIZER_BYTES = 2 * MAX_WEIGHTS_BYTES + (64 << 20)
# Groups the validator decoded, held for the handler that follows it (by message id), so a
# group is decoded and its signatures checked once. A validated message is handled at once,
# so a few hundred cover any burst; one evicted early is only decoded again.
MAX_DECODED_GROUPS = 512
# Decoded groups kept for the check and the training step that may follow, least recently
# used first out, bounded by their message bytes: decoded records take about 9x their bytes
# (a 256 KiB group is 2.3 MiB of Python objects, measured in review), so 32 MiB of messages is
# at most ~300 MiB, and thousands of groups of the sizes a devnet makes. One that is gone is
# read back from the store and decoded again, signatures checked as when it arrived.
DECODED_GROUP_BYTES = 32 << 20


class Node:
    """One node. ``await node.run(stop)`` until ``stop`` is set."""

    def __init__(self, config: NodeConfig, transport: Transport, key: NodeKey,
                 log: structlog.BoundLogger | None = None, work: Callable[..., Work] = Work,
                 trainer: Callable[..., PolicyTrainer] = PolicyTrainer) -> None:
        """``work`` makes the node's model work and ``trainer`` its trainer role: honest
        :class:`~vrl.node.work.Work` and :class:`~vrl.node.work.PolicyTrainer`, or for a node
        configured to cheat, what :func:`vrl.harness.adversary.work_for` and
        :func:`vrl.harness.adversary.trainer_for` give."""
        self.config, self.transport, self.key = config, transport, key
        self.log = (log or structlog.get_logger()).bind(node=key.node_id.hex()[:8])
        self.metrics = NodeMetrics()
        self.store = Store(config.path / "node.sqlite")
        self.store.claim(key.node_id)
        self.blob_dir = config.path / "blobs"
        self.blob_dir.mkdir(parents=True, exist_ok=True)
        self.tasks, problems = open_task_set(config.work.task, config.work.columns)
        for problem in problems:
            self.log.warning("task skipped", problem=str(problem))
        try:
            self.private = any(committed_reference(t.answer) for t in getattr(self.tasks, "tasks", ()))
        except ValueError as error:
            raise ConfigError(str(error), ("work", "task")) from None
        # A network of private tasks (specs/zk.md §11): the trainer holds the answer key and
        # proves each trained record's correctness; every node checks those proofs.
        self.answer_key, self._reward_proofs = self._private_tasks(config) if self.private else (None, None)
        if config.zk.answers and not self.private:
            raise ConfigError("answers is the answer key of a private task set; this [work] task has no committed "
                              "reference (vrl commit-answers)", ("zk", "answers"))
        self.reward_spec = config.work.reward_spec  # checked when the config was made
        # A node that cannot compute the network's reward would refuse every honest record as
        # reward_unknown: it stops here instead, saying why (specs/rewards.md §6).
        if missing := self.reward_spec.unknown() + self.reward_spec.unavailable():
            raise ConfigError(f"this node cannot compute the network's reward: {'; '.join(missing)}", ("work", "reward"))
        if self.private and (problem := self.reward_spec.provable()):
            raise ConfigError(problem, ("work", "reward"))
        torch.set_num_threads(config.torch_threads)
        # The node.toml's tables go through as they are: each is its library's config.
        self.work = work(key, WorkConfig(**as_kwargs(config.work), tasks=self.tasks,
                                         groups_per_round=config.protocol.groups_per_round,
                                         hidden_states=config.zk.hidden_states), self._expectations)
        context = context_length(self.work.skeleton)
        if context is not None and self.work.max_new_tokens >= context:
            raise ConfigError(f"the model has {context} positions; max_new_tokens must leave room for a prompt",
                              ("work", "max_new_tokens"))
        if not config.work.max_new_tokens:
            self.log.info("max_new_tokens chosen from the task set", max_new_tokens=self.work.max_new_tokens,
                          why=self.work.max_new_tokens_why)
        self.protocol = P.NodeProtocol(key, P.ProtocolConfig(
            **as_kwargs(config.protocol), roles=frozenset(config.roles), trainer=bytes.fromhex(config.trainer),
            pretrusted=frozenset(bytes.fromhex(p) for p in config.pretrusted), reputation=config.reputation,
            admission=config.admission), platform_tag(self.work.skeleton), profile_of(self.work.skeleton).race_loss_rate)
        self.trainer: PolicyTrainer | None = None
        if "trainer" in config.roles:
            # The trainer trains the network's model on its task ([work]); the rest is the
            # node's: a step per admitted batch, a checkpoint per version (announced after it
            # is on disk), one step past the last version.
            self.trainer = trainer(TrainConfig(
                **{**as_kwargs(config.work), "max_new_tokens": self.work.max_new_tokens}, **as_kwargs(config.train),
                grpo=config.grpo,
                steps=max(config.protocol.last_version, 1) + 1, groups_per_step=config.admission.batch_groups,
                checkpoint_every=1), config.path / "trainer", key,
                # The tasks this node read once: the trainer trains on what its checks expect,
                # even if the file changes on disk meanwhile (a private set's answers opened).
                tasks=self.tasks if self.answer_key is None else TaskList(self.tasks.name, tuple(
                    self.answer_key.opened(self.tasks.tasks))))
        cheat = self.work.cheat or (self.trainer.cheat if self.trainer is not None else "")
        if cheat != config.adversary:
            raise ValueError(f"adversary {config.adversary!r} is configured, but the work and trainer given do "
                             f"{cheat or 'no cheat'}: make them with vrl.harness.adversary.work_for and trainer_for")
        self.blobs = BlobStore(transport)
        self._zk = self._sampling_proofs(config) if config.zk.hidden_states or config.zk.sampling_positions else None
        self._served: OrderedDict[tuple[bytes, bytes], None] = OrderedDict()  # MAX_SERVED
        # The last answers sent, by (peer, group, challenge, positions), sent again as they are.
        self._answers: OrderedDict[tuple[bytes, bytes, bytes, int], bytes] = OrderedDict()
        self._proving: asyncio.Lock | None = None  # one job in the prover process at a time
        self._model_thread = ThreadPoolExecutor(1, thread_name_prefix="vrl-model")
        # Proving takes seconds a position and ezkl holds the GIL meanwhile (2.8 s of 3.2 s,
        # measured): in a thread it stalled the event loop, and libp2p dropped the node's
        # connections (bench/devnet.py zk). So it runs in a process of its own, started on the
        # first request and kept.
        self._prover: ProcessPoolExecutor | None = None
        self._tasks: set[asyncio.Task] = set()
        self._stopping = False
        self._decoded: OrderedDict[bytes, Group] = OrderedDict()  # message id -> group (MAX_DECODED_GROUPS)
        self._bodies: OrderedDict[bytes, Group] = OrderedDict()  # digest -> group (DECODED_GROUP_BYTES)
        self._body_bytes = 0
        self._feeding = 0  # events whose actions are under way (_feed)

    # -- helpers ------------------------------------------------------------------------------
    def _sampling_proofs(self, config: NodeConfig):
        """The SRS sampling proofs use here (the [zk] table), once its policy is known to have a
        circuit and an answer to fit the transport's response limit."""
        from proofs import zk
        from vrl.zk.sampling import circuit_for

        try:
            circuit = circuit_for(self.work.skeleton)
        except SamplingProofError as error:
            raise ConfigError(str(error), ("zk",)) from None
        proving = config.work.group_size * config.zk.sampling_positions * PROVE_SECONDS_PER_POSITION
        if 2 * proving > config.zk.proof_timeout:
            raise ConfigError(f"a group's {config.work.group_size} x {config.zk.sampling_positions} positions take "
                              f"about {proving:.0f} s to prove here; proof_timeout must be at least twice that",
                              ("zk", "proof_timeout"))
        if config.work.group_size * config.zk.sampling_positions * MAX_OPENING_BYTES > MAX_RESPONSE_BYTES:
            raise ConfigError(f"group_size x sampling_positions answers would pass the {MAX_RESPONSE_BYTES}-byte "
                              f"response limit at {MAX_OPENING_BYTES} bytes a position", ("zk", "sampling_positions"))
        # The user's zk directory, as vrl prove and vrl verify use: nodes on one machine share
        # its circuits and keys, and with dev_srs its one dev SRS (their proofs must agree on it).
        from vrl.zk import work_directory

        workdir = work_directory()
        (config.path / "hidden").mkdir(parents=True, exist_ok=True)
        try:
            return zk.Srs.load(config.zk.srs) if config.zk.srs else zk.dev_srs(workdir, circuit.logrows), workdir
        except zk.ZkError as error:
            raise ConfigError(str(error), ("zk", "srs")) from None

    def _private_tasks(self, config: NodeConfig):
        """The answer key (a trainer's) and the SRS the reward proofs of a network of private
        tasks are made and checked against, with the zk directory (specs/zk.md §11)."""
        from proofs import zk
        from proofs.circuits import ANSWER_MATCH
        from vrl.zk import AnswerKey, ZkFileError, work_directory

        if bool(config.zk.srs) == config.zk.dev_srs:
            raise ConfigError("this task set is private (its references are committed): every node checks the "
                              "trainer's reward proofs, so [zk] needs srs = PATH, or dev_srs = true (INSECURE)",
                              ("zk", "srs"))
        key = None
        if "trainer" in config.roles:
            if not config.zk.answers:
                raise ConfigError("this task set is private (its references are committed): its trainer proves "
                                  "each trained record's correctness, so [zk] needs answers = the answer key "
                                  "(vrl commit-answers)", ("zk", "answers"))
            try:
                key = AnswerKey.read(config.zk.answers)
                key.check(self.tasks.tasks)
            except ZkFileError as error:
                raise ConfigError(str(error), ("zk", "answers")) from None
        elif config.zk.answers:
            raise ConfigError("only the trainer holds the answer key: a node that does not train has no use for "
                              "it, and keeping it where it is not needed only risks it", ("zk", "answers"))
        workdir = work_directory()
        try:
            srs = zk.Srs.load(config.zk.srs) if config.zk.srs else zk.dev_srs(workdir, ANSWER_MATCH.logrows)
        except zk.ZkError as error:
            raise ConfigError(str(error), ("zk", "srs")) from None
        return key, (srs, workdir)

    def _expectations(self, version: int) -> Expectations:
        policy = self.protocol.policies[version]
        return Expectations(tasks=self.tasks, round_seed=round_seed(policy.model_hash, version),
                            sampling=self.work.sampling, reward_spec=self.reward_spec,
                            correctness_later=self.private)

    async def _in_model_thread(self, kind: str, fn: Callable, *args):
        started = time.perf_counter()
        try:
            return await asyncio.get_running_loop().run_in_executor(self._model_thread, fn, *args)
        finally:
            self.metrics.step_seconds.labels(kind).observe(time.perf_counter() - started)

    async def _in_prover(self, kind: str, fn: Callable, *args):
        """``fn(*args)`` in the prover process, one job at a time: a job whose caller gave up
        while it waited (a verifier's timeout) is cancelled here, before it costs any proving.
        A prover that died (out of memory, killed) raises BrokenProcessPool, and a fresh one
        serves the next job."""
        if self._proving is None:
            self._proving = asyncio.Lock()
        async with self._proving:
            if self._prover is None:
                self._prover = ProcessPoolExecutor(1, mp_context=multiprocessing.get_context("spawn"),
                                                   initializer=prover_init)
            started = time.perf_counter()
            try:
                return await asyncio.get_running_loop().run_in_executor(self._prover, fn, *args)
            except BrokenProcessPool:
                self._prover = None
                raise
            finally:
                self.metrics.step_seconds.labels(kind).observe(time.perf_counter() - started)

    def _spawn(self, coroutine) -> asyncio.Task:
        task = asyncio.create_task(coroutine)
        self._tasks.add(task)
        task.add_done_callback(self._finished)
        return task

    def _finished(self, task: asyncio.Task) -> None:
        self._tasks.discard(task)
        if not task.cancelled() and task.exception() is not None:
            self.log.error("task failed", error=repr(task.exception()))

    def _remember(self, message_id: bytes, group: Group) -> None:
        self._decoded[message_id] = group
        while len(self._decoded) > MAX_DECODED_GROUPS:
            self._decoded.popitem(last=False)

    def _group_of(self, message_id: bytes, data: bytes) -> Group:
        """The group a validated message holds: decoded by the validator, else decoded now."""
        group = self._decoded.pop(message_id, None)
        return group if group is not None else decode_group(data)

    def _keep(self, group: Group) -> None:
        """Hold a stored group's decoded records for its check and training step."""
        if group.digest in self._bodies:
            self._bodies.move_to_end(group.digest)
            return
        self._bodies[group.digest] = group
        self._body_bytes += sum(map(len, group.submission.records))
        while self._body_bytes > DECODED_GROUP_BYTES and len(self._bodies) > 1:
            _, old = self._bodies.popitem(last=False)
            self._body_bytes -= sum(map(len, old.submission.records))

    def _body(self, digest: bytes) -> Group | None:
        """A stored group, decoded: held since it arrived, else read back from the store."""
        group = self._bodies.get(digest)
        if group is None:
            submission = self.store.group(digest)
            if submission is None:
                return None
            try:  # the disk is trusted no more than the network was
                group = decode_group(submission.to_bytes())
            except MessageError as error:
                self.log.warning("stored group does not decode", group=digest.hex()[:12], error=str(error))
                return None
        self._keep(group)
        return group

    # -- validators: cheap, pure, before anything is stored or forwarded -------------------------
    def _validate(self, message: Message) -> Validation:
        try:
            if message.topic == TOPIC_GROUPS:
                group = decode_group(message.data)
                if group.subject in self.protocol.quarantined:
                    return Validation.IGNORE  # the forwarder is not at fault
                # Network parameters (specs/network.md §3.1): a round has groups_per_round
                # groups of group_size samples per node, of a version still usable. A worker
                # free to submit any index or size could keep the groups or samples it likes.
                # Ignored, not rejected: a peer configured otherwise is not hostile.
                if (group.index >= self.protocol.config.groups_per_round
                        or len(group.rollouts) != self.config.work.group_size
                        or not self.protocol.may_hold(group.version)
                        or self.protocol.slot_taken(group.subject, group.version, group.index, group.digest)):
                    return Validation.IGNORE
                self._remember(message.msg_id, group)
            elif message.topic == TOPIC_VERDICTS:
                verdict = SignedVerdict.from_bytes(message.data)
                if not verdict.valid():
                    return Validation.REJECT
                if self.protocol.matches_group(verdict) is False or not self.protocol.room_for(verdict):
                    # Its subject or version is not the group's, or the group has all the
                    # strangers' verdicts it takes: not forwarded, but not the forwarder's fault
                    # (it may not have had the group yet, or seen fewer verdicts).
                    return Validation.IGNORE
            elif message.topic == TOPIC_POLICIES:
                announcement = PolicyAnnouncement.from_bytes(message.data)
                if not announcement.valid():
                    return Validation.REJECT
                if announcement.trainer != self.protocol.config.trainer:
                    return Validation.IGNORE
            elif message.topic == TOPIC_STEPS:
                step = StepVerdict.from_bytes(message.data)
                if not step.valid():
                    return Validation.REJECT
                if step.trainer != self.protocol.config.trainer or not self.protocol.may_hold(step.version):
                    return Validation.IGNORE
            else:
                return Validation.IGNORE
        except MessageError:
            self.metrics.invalid.labels(message.topic).inc()
            return Validation.REJECT
        return Validation.ACCEPT

    # -- incoming ------------------------------------------------------------------------------
    async def _on_message(self, message: Message) -> None:
        """A gossip message the transport already ran :meth:`_validate` on: store, then feed."""
        if self._stopping:
            return  # the transport may still deliver while the node shuts down
        now = time.time()
        if message.topic == TOPIC_GROUPS:
            group = self._group_of(message.msg_id, message.data)
            if self.store.put_group(group.submission, group.subject, group.version, now):
                self._keep(group)
                self.metrics.groups_received.inc()
                if group.subject != self.key.node_id:
                    self.work.observe(group)
            await self._feed(P.GroupReceived(group, now))
        elif message.topic == TOPIC_VERDICTS:
            # Stored by the protocol's Persist, once its group is known and agrees with it.
            await self._feed(P.VerdictReceived(SignedVerdict.from_bytes(message.data)))
        elif message.topic == TOPIC_POLICIES:
            announcement = PolicyAnnouncement.from_bytes(message.data)
            self.store.put_policy(announcement, now)
            await self._feed(P.PolicyAnnounced(announcement))
        elif message.topic == TOPIC_STEPS:
            # Stored by the protocol's PersistStep, once it names a known announcement.
            await self._feed(P.StepVerdictReceived(StepVerdict.from_bytes(message.data)))

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

    # -- actions -------------------------------------------------------------------------------
    async def _do(self, action: P.Action) -> None:
        match action:
            case P.Publish(topic, data):
                await self._publish(topic, data)
            case P.FetchPolicy(announcement):
                self._spawn(self._fetch_policy(announcement))
            case P.Generate(version):
                self._spawn(self._generate(version))
            case P.Check(group, version):
                self._spawn(self._check(group, version))
            case P.Plant(version):
                self._spawn(self._plant(version))
            case P.Train(version, batch):
                self._spawn(self._train(version, batch))
            case P.Quarantine(node, purged):
                self.log.warning("quarantined", peer=node.hex()[:8], purged_groups=len(purged))
            case P.Persist(verdict):
                if self.store.put_verdict(verdict, time.time()):
                    self.metrics.verdicts.labels(verdict.outcome).inc()
            case P.ReplayStep(announcement):
                self._spawn(self._replay_step(announcement))
            case P.PersistStep(verdict):
                self.store.put_step(verdict, time.time())
                if verdict.outcome == "fraud":
                    self.log.warning("step reported as fraud", version=verdict.version, reporter=verdict.verifier.hex()[:8],
                                     reasons=list(verdict.reasons))
            case P.ConvictTrainer(trainer, version, reasons, reporters):
                self.metrics.trainer_convicted.set(1)
                self.metrics.trainer_fraud_version.set(version)
                self.log.critical("TRAINER FRAUD CONFIRMED: following none of its versions from this one on",
                                  trainer=trainer.hex()[:8], version=version, reasons=list(reasons),
                                  reporters=[r.hex()[:8] for r in reporters])

    async def _publish(self, topic: str, data: bytes) -> None:
        """Own messages are stored first (acknowledged), then gossiped; delivery to ourselves
        comes back through :meth:`_on_message`, where storing again is a no-op."""
        if self._stopping:
            return
        now = time.time()
        if topic == TOPIC_GROUPS:
            group = self._group_of(message_id(topic, data), data)
            self.store.put_group(group.submission, group.subject, group.version, now,
                                 planted=group.digest in self.protocol.planted)
        elif topic == TOPIC_VERDICTS:
            verdict = SignedVerdict.from_bytes(data)
            if self.store.put_verdict(verdict, now) and not verdict.checked:
                self.metrics.skipped.inc()
        elif topic == TOPIC_POLICIES:
            self.store.put_policy(PolicyAnnouncement.from_bytes(data), now)
        elif topic == TOPIC_STEPS:
            step = StepVerdict.from_bytes(data)
            self.store.put_step(step, now)
            self.metrics.steps_replayed.labels(step.outcome).inc()
            (self.log.error if step.reasons else self.log.info)(
                "step judged", version=step.version, outcome=str(step.outcome), reasons=list(step.reasons),
                drift=step.drift)
        try:
            await self.transport.publish(topic, data)
        except TransportError as error:
            self.log.warning("publish failed; peers will backfill it", topic=topic, error=str(error))

    async def _blob(self, digest: bytes, max_size: int, what: str) -> bytes:
        """A blob by its SHA-256: from this node's blob directory, else fetched from peers
        (the trainer first), hash-checked, stored and served onward. Raises on failure."""
        path = self.blob_dir / digest.hex()
        blob = path.read_bytes() if path.exists() else None
        if blob is not None and hashlib.sha256(blob).digest() != digest:
            # Damaged on disk (bit rot, a hand edit): fetch it again rather than fail forever.
            self.log.warning("stored blob does not match its hash; fetching again", what=what)
            path.unlink()
            blob = None
        if blob is None:
            peers = sorted(self.transport.peers(), key=lambda p: p != self.protocol.config.trainer)
            blob = await fetch_blob(self.transport, peers, digest, max_size=max_size, timeout=60.0)
            write_bytes_atomic(path, blob)
        self.blobs.put(blob)
        return blob

    def _keep_blob(self, blob: bytes) -> bytes:
        """Store a blob this node made (weights, optimizer state, step config) and serve it."""
        digest = hashlib.sha256(blob).digest()
        write_bytes_atomic(self.blob_dir / digest.hex(), blob)
        self.blobs.put(blob)
        return digest

    async def _fetch_policy(self, announcement: PolicyAnnouncement) -> None:
        try:
            blob = await self._blob(announcement.blob, min(announcement.size, MAX_WEIGHTS_BYTES),
                                    f"weights of version {announcement.version}")
            await self._in_model_thread("load", self.work.load, announcement, blob,
                                        self.config.protocol.max_staleness + 1)
        except Exception as error:  # a failed fetch is retried by the protocol's next pending()
            self.log.warning("policy fetch failed", version=announcement.version, error=repr(error))
            await self._feed(P.Abandoned(P.FetchPolicy(announcement)))
            return
        self.metrics.policy_version.set(announcement.version)
        self.log.info("policy loaded", version=announcement.version, model_hash=announcement.model_hash.hex()[:16])
        await self._feed(P.PolicyLoaded(announcement.version))

    async def _generate(self, version: int) -> None:
        groups = await self._in_model_thread("generate", self.work.generate, version)
        for group in groups:  # signed here, so stored and published without decoding them again
            self._remember(message_id(TOPIC_GROUPS, group.to_bytes()), group)
            if self.config.zk.hidden_states:  # on disk before the group is published
                await asyncio.to_thread(write_witness, self._witness_path(group.digest),
                                        self.work.take_rows(group))
        if self.config.zk.hidden_states:
            await asyncio.to_thread(self._prune_witness)
        self.metrics.rollouts_produced.inc(sum(len(g.rollouts) for g in groups))
        self.log.info("generated", version=version, groups=len(groups))
        await self._feed(P.Generated(version, tuple(groups)))

    async def _check(self, digest: bytes, version: int) -> None:
        group = self._body(digest)
        # A check that will ask its producer for proofs waits, a tick at a time, until the
        # producer is connected, before any prefill (specs/network.md §3.4).
        unreached = (group is not None and self.config.zk.sampling_positions > 0
                     and group.subject not in self.transport.peers())
        if group is None or version not in self.work.models or unreached:
            await self._feed(P.Abandoned(P.Check(digest, version)))
            return
        result = await self._in_model_thread("check", self.work.check, group, version)
        reasons = result.reasons
        if not reasons and self.config.zk.sampling_positions:
            challenged = await self._challenge(group, version)
            if challenged is None:  # not asked after all; the protocol asks for the check again
                await self._feed(P.Abandoned(P.Check(digest, version)))
                return
            reasons = challenged
        if Reason.REWARD_UNKNOWN in reasons:
            # This machine could not compute the reward just now (its sandbox could not start: a
            # full disk, no process to spare): its own limit, not the producer's fault. No
            # verdict; the protocol asks for the check again (specs/rewards.md §6).
            self.log.warning("reward not computable here; check left for later", group=digest.hex()[:12])
            await self._feed(P.Abandoned(P.Check(digest, version)))
            return
        outcome = P.outcome_of(reasons)
        self.metrics.checks.labels(outcome).inc()
        for reason in reasons:
            self.metrics.rejected.labels(reason).inc()
        if reasons:
            self.log.warning("check failed", group=digest.hex()[:12], reasons=sorted(set(reasons)))
        await self._feed(P.Checked(digest, reasons, result.digest, result.race_tokens, result.races_lost))

    # -- sampling proofs between nodes (specs/network.md §3.4) -----------------------------------
    def _witness_path(self, digest: bytes):
        return self.config.path / "hidden" / f"{digest.hex()}.hidden"

    def _prune_witness(self) -> None:
        """Keep the rows of the last MAX_WITNESS_FILES groups: a group older than that is of a
        version no verifier still checks (max_staleness), so no challenge can come for it."""
        files = sorted((self.config.path / "hidden").glob("*.hidden"), key=lambda p: p.stat().st_mtime)
        for path in files[:-MAX_WITNESS_FILES]:
            path.unlink(missing_ok=True)

    async def _challenge(self, group: Group, version: int) -> tuple[str, ...] | None:
        """Ask ``group``'s producer to prove the positions this verifier's audit ticket picks, and
        check the answer: a refusal, a reset, no answer in time, or none that decodes fails like
        a bad proof. None (no verdict) only when the producer is not connected when asked:
        unreached is not unanswered, and a sparse network must not make an honest producer look
        a cheat. Once the request is on its way, nothing the producer does is "unreached". A
        failure of this verifier's own (ezkl, here) is no verdict either; asked again, the
        producer sends the same answer."""
        positions = self.config.zk.sampling_positions
        if group.subject not in self.transport.peers():  # dropped since _check looked
            return None
        model = self.work.models.get(version)  # taken now: the answer may come after the version is let go
        if model is None:
            return None
        challenge = hashlib.sha256(audit_ticket(self.key, group.digest)).digest()
        request = SamplingRequest(group.digest, challenge, positions)
        try:
            answer = await self.transport.request(
                group.subject, SAMPLING_PROTOCOL, request.to_bytes(), timeout=self.config.zk.proof_timeout,
                max_response=len(group.rollouts) * positions * MAX_OPENING_BYTES + 1024)
        except TransportError as error:
            self.log.warning("no sampling proofs", group=group.digest.hex()[:12],
                             producer=group.subject.hex()[:8], error=type(error).__name__)
            return ("sampling_missing",)
        srs, workdir = self._zk
        try:
            return await self._in_model_thread("sampling proofs", self.work.check_sampling, group, model, answer,
                                               challenge, positions, srs, workdir)
        except (ZkError, SamplingProofError) as error:  # ezkl failing here: this verifier's own problem
            self.log.warning("sampling proofs not checked", group=group.digest.hex()[:12], error=str(error))
            return None

    async def _serve_sampling(self, peer: bytes, data: bytes) -> bytes:
        """Prove positions of one of this node's own groups, once per asking peer and group; a
        request no honest verifier sends counts against its sender."""
        try:
            request = SamplingRequest.from_bytes(data)
        except MessageError:
            self.transport.penalize(peer)
            raise
        if self._stopping:
            raise MessageError("sampling request: this node is stopping")
        group = self._body(request.group)
        if group is None or group.subject != self.key.node_id or request.positions > self.config.zk.max_positions:
            raise MessageError("sampling request: not a group of this node's, or more positions than it proves")
        asked = (peer, request.group, request.challenge, request.positions)
        if asked in self._answers:  # the same question again: the same answer, no new proofs
            return self._answers[asked]
        if (peer, request.group) in self._served:
            raise MessageError("sampling request: this group was answered to this peer already")
        self._served[peer, request.group] = None
        while len(self._served) > MAX_SERVED:
            self._served.popitem(last=False)
        model = self.work.models.get(group.version)  # taken now: the version may be let go while it waits
        if model is None:
            raise MessageError(f"sampling request: version {group.version} is no longer held here")
        srs, workdir = self._zk
        try:
            answer = await self._in_prover("prove", answer_challenge, head_weight(model), group.rollouts,
                                           self._witness_path(request.group), request.challenge, request.positions,
                                           srs, workdir)
        except (SamplingProofError, ZkError) as error:
            raise MessageError(f"sampling request: {error}") from None
        except BrokenProcessPool:
            raise MessageError("sampling request: the prover process died") from None
        except Exception as error:  # noqa: BLE001 (pickling, spawning: the prover's failure, named)
            raise MessageError(f"sampling request: the prover failed ({type(error).__name__})") from None
        self._answers[asked] = answer
        while len(self._answers) > MAX_KEPT_ANSWERS:
            self._answers.popitem(last=False)
        self.log.info("sampling proofs sent", group=request.group.hex()[:12], to=peer.hex()[:8],
                      positions=request.positions * len(group.rollouts))
        return answer

    async def _plant(self, version: int) -> None:
        submission, canary = await self._in_model_thread("plant", self.work.plant, version)
        self.log.info("planted a known-bad group", group=submission.digest.hex()[:12], canary=canary.hex()[:8])
        await self._feed(P.Planted(submission, canary, version))

    async def _train(self, version: int, batch: tuple[tuple[bytes, float], ...]) -> None:
        assert self.trainer is not None
        batch = self.trainer.choose(batch, self.protocol)
        groups = [self._body(digest) for digest, _ in batch]  # stored, so never None
        try:
            rewards, proofs = await self._prove_rewards(groups) if self.answer_key is not None else (None, (b"", 0))
            step, refused = await self._in_model_thread("train", self.trainer.step, groups, [w for _, w in batch],
                                                        self._screen(groups), rewards, proofs)
        except Exception as error:  # whatever the step failed on: the round must not stall on it
            self.log.error("training step failed; the round will ask again", version=version, error=repr(error))
            await self._feed(P.Abandoned(P.Train(version, batch)))
            return
        for digest, result in refused.items():
            self.metrics.checks.labels(P.outcome_of(result.reasons)).inc()
            for reason in result.reasons:
                self.metrics.rejected.labels(reason).inc()
            self.log.warning("refused to train a group its own pass failed", group=digest.hex()[:12],
                             reasons=sorted(set(result.reasons)))
            await self._feed(P.Refused(P.Checked(digest, result.reasons, result.digest, result.race_tokens,
                                                 result.races_lost)))
        if step is None:  # every group refused: the round goes on, and the protocol asks again
            await self._feed(P.Abandoned(P.Train(version, batch)))
            return
        await self._announce(step)
        for group in groups:
            self.metrics.groups_trained.labels(group.subject.hex()[:8]).inc()

    async def _prove_rewards(self, groups: list[Group]) -> tuple[list[list[float]], tuple[bytes, int]]:
        """The rewards a step of private tasks trains on, and the proofs file that shows them
        (stored and served, by hash and size): one answer-match proof per distinct answer to a
        task, made in the prover process (specs/zk.md §11). The trainer checks its own proofs
        as a verifier will, and trains on what they show."""
        from vrl.zk import attachments_bytes, named_proofs, proof_plan, prove_statements, training_rewards

        srs, workdir = self._reward_proofs
        decode = self.work.skeleton.decode
        records = [list(g.rollouts) for g in groups]
        statements, named = await self._in_model_thread("plan proofs", proof_plan,
                                                        [r for g in records for r in g], self.answer_key, decode)
        started = time.perf_counter()
        proofs = await self._in_prover("prove rewards", prove_statements, statements, srs, workdir)
        proving = time.perf_counter() - started
        attachments = named_proofs(proofs, named)
        rewards, failures = await self._in_model_thread(
            "check proofs", functools.partial(training_rewards, allow_dev=srs.dev), records, attachments, decode,
            [srs], workdir)
        if failures:  # never an honest trainer's: ezkl or the SRS failing here
            raise RuntimeError(f"{len(failures)} of its own reward proofs fail: {sorted(set(failures.values()))}")
        self.log.info("rewards proven", records=sum(map(len, records)), proofs=len(statements),
                      attachments=len(attachments), seconds=round(proving, 2))
        if not attachments:
            return rewards, (b"", 0)
        blob = attachments_bytes(attachments)
        return rewards, (self._keep_blob(blob), len(blob))

    def _screen(self, groups: list[Group]) -> Screen:
        """What checks the batch before the step (PolicyTrainer.screened): every group from the
        step's own pass or a prefill of its version, except an older version's group this node
        has checked itself already (its verdict stands) or whose weights it no longer holds."""
        mine = {g.digest for g in groups if (v := self.protocol.verdicts.get(g.digest, {}).get(self.key.node_id)) is not None
                and v.checked}
        held = set(self.work.models)

        def screen(group: Group, version: int, forward: PolicyForward | None) -> CheckResult | None:
            if forward is None and (group.digest in mine or version not in held):
                return None
            result = self.work.check(group, version, forward)
            if result.reasons and forward is not None:
                # The training pass batches all groups and runs with gradients, which no
                # calibration measured: a failure there is confirmed by the verifier's own
                # prefill before a group is refused (a refusal is a fraud report). Rare: cheap.
                result = self.work.check(group, version)
            return result
        return screen

    async def _announce(self, step: TrainedStep) -> None:
        """Publish the trainer's current weights as the next version, bound to the step that
        made them (specs/training.md §3); every file it names is stored and served first."""
        assert self.trainer is not None
        version = self.trainer.version
        parent = self.protocol.policies.get(version - 1)
        announcement = PolicyAnnouncement(
            self.key.node_id, version, step.model.model_hash, self._keep_blob(step.blob), len(step.blob),
            parent=parent.model_hash if parent is not None else b"", batch=step.batch,
            config=self._keep_blob(self.trainer.config_file), optimizer_before=step.optimizer_before,
            optimizer=self._keep_blob(step.optimizer), optimizer_size=len(step.optimizer),
            platform=platform_tag(step.model), proofs=step.proofs[0], proofs_size=step.proofs[1]).signed(self.key)
        self.work.install(version, self.trainer.frozen_copy(step.model), self.config.protocol.max_staleness + 1)
        metrics = {k: v for k, v in step.metrics.items() if isinstance(v, (int, float))}
        if "held_out_accuracy" in metrics:
            self.metrics.held_out_accuracy.set(metrics["held_out_accuracy"])
            self.metrics.expected_accuracy.set(metrics["held_out_expected_accuracy"])
        self.metrics.policy_version.set(version)
        self.store.put_policy(announcement, time.time())
        used = tuple(d for d, _ in step.batch)
        self.store.put_trained(version, used, json.dumps(metrics, sort_keys=True))
        # [train] report_to: the same numbers, stored first, at step = the version they made.
        self.trainer.trainer.trackers.log({"step": version, **metrics})
        self.log.info("policy published", version=version, groups=len(step.batch), **{
            k: round(v, 4) for k, v in metrics.items() if k in ("held_out_accuracy", "held_out_expected_accuracy", "rewards_mean", "loss")})
        await self._feed(P.Trained(announcement, used))

    async def _replay_step(self, announcement: PolicyAnnouncement) -> None:
        """Replay the step that made ``announcement`` (drawn by this node's step ticket, or
        reported as fraud by another) and report what it found."""
        version = announcement.version
        parent = self.protocol.policies.get(version - 1)
        groups = [self._body(digest) for digest in announcement.groups]
        if (parent is None or any(g is None for g in groups) or version not in self.work.models
                or version - 1 not in self.work.models):
            await self._feed(P.Abandoned(P.ReplayStep(announcement)))
            return
        try:
            config = await self._blob(announcement.config, MAX_STEP_CONFIG_BYTES, f"step config of version {version}")
            before = await self._blob(announcement.optimizer_before, min(parent.optimizer_size, MAX_OPTIMIZER_BYTES),
                                      f"optimizer state of version {version - 1}")
            after = await self._blob(announcement.optimizer, min(announcement.optimizer_size, MAX_OPTIMIZER_BYTES),
                                     f"optimizer state of version {version}")
            records = sum(len(g.rollouts) for g in groups)
            proofs = await self._blob(announcement.proofs, min(announcement.proofs_size, max_proofs_bytes(records)),
                                      f"reward proofs of version {version}") if self.private and announcement.proofs else b""
        except Exception as error:  # whatever the fetch failed on; the protocol decides when it is fraud
            self.log.warning("step state unavailable", version=version, error=repr(error))
            for action in self.protocol.step_state_missing(version):
                await self._do(action)
            return
        try:
            rewards, unproven = (await self._in_model_thread("check proofs", self._step_rewards, groups, proofs)
                                 if self.private else (None, ()))
        except ZkError as error:
            # ezkl failing here (a circuit this machine cannot build or hold): this node's own
            # problem, so no verdict; not retried, since it would fail the same way every tick.
            self.log.error("reward proofs cannot be checked here; the step is left unjudged", version=version,
                           error=str(error))
            return
        faults, replayed, drift = await self._in_model_thread("replay", self.work.replay, announcement, config,
                                                              before, after, groups, rewards)
        faults = (*faults, *unproven)
        self.metrics.step_drift.set(drift)
        await self._feed(P.StepReplayed(version, faults, replayed, drift))

    def _step_rewards(self, groups: list[Group], proofs: bytes) -> tuple[list[list[float]], tuple[str, ...]]:
        """What a step of private tasks must have trained on, from the proofs file its
        announcement binds (vrl.zk.step_rewards), and ``(REWARD_UNPROVEN,)`` when a record's
        proof is missing or fails: the step is at fault."""
        from vrl.zk import step_rewards

        srs, workdir = self._reward_proofs
        rewards, fault = step_rewards([list(g.rollouts) for g in groups], proofs, self.work.skeleton.decode, [srs],
                                      workdir, allow_dev=srs.dev)
        if fault is not None:
            self.log.warning("reward proofs fail", reason=fault)
        return rewards, () if fault is None else (StepFault.REWARD_UNPROVEN,)

    # -- catching up ---------------------------------------------------------------------------
    async def _serve_backfill(self, peer: bytes, data: bytes) -> bytes:
        """Answer one page; a malformed request counts against its sender (as an invalid gossip
        message does) and raises MessageError, which the transport answers with an error."""
        try:
            request = BackfillRequest.from_bytes(data)
        except MessageError:
            self.transport.penalize(peer)
            raise
        # Off the event loop: a page is a SQLite read of up to 1 MiB.
        messages, following = await asyncio.to_thread(self.store.since, request.since, BACKFILL_PAGE_BYTES,
                                                      request.after)
        return BackfillPage(tuple(messages), following).to_bytes()

    async def backfill(self, since: int | None = None) -> int:
        """Ask every connected peer for what gossip did not bring (this node was away, a
        partition, a drop, a clogged link) of rounds ``>= since``; returns the number of
        messages it had not stored before. Known messages cost a hash, not a validation."""
        if since is None:
            since = max((self.protocol.version or 0) - self.config.protocol.max_staleness, 0)
        fed = 0
        for peer in sorted(self.transport.peers()):
            after: int | None = 0
            for _ in range(BACKFILL_MAX_PAGES):
                try:
                    raw = await self.transport.request(peer, BACKFILL_PROTOCOL, BackfillRequest(
                        since, after).to_bytes(), timeout=10.0)
                    page = BackfillPage.from_bytes(raw, after)
                except (TransportError, MessageError) as error:
                    if isinstance(error, MessageError):
                        self.transport.penalize(peer)  # its page breaks specs/network.md §6
                    self.log.info("backfill from peer stopped", peer=peer.hex()[:8], error=str(error))
                    break
                after = page.next
                for data in page.messages:
                    topic = topic_of(data)
                    if topic is None or self.store.has(topic, data):
                        continue
                    message = Message(topic, data, peer, message_id(topic, data))
                    if self._validate(message) is Validation.ACCEPT:
                        await self._on_message(message)
                        self.metrics.backfilled.labels(topic).inc()
                        fed += 1
                if after is None:
                    break
        return fed

    # -- life cycle ----------------------------------------------------------------------------
    def _replay(self) -> None:
        """Rebuild the protocol's state from the store (no actions: they happened already)."""
        def earlier_protocol(what: str, error: MessageError) -> StoreError:
            return StoreError(f"{self.store.path}: a stored {what} is not one this node can follow ({error}); "
                              f"it was written by an earlier protocol: start this node with a new data_dir")

        for kind, data, extra in self.store.replay():
            if kind == "policy":
                try:
                    announcement = PolicyAnnouncement.from_bytes(data)
                except MessageError as error:
                    raise earlier_protocol("policy announcement", error) from None
                # The clock as it was when the policy arrived: its round started then, not at 0.
                self.protocol.handle(P.Tick(extra[0]), replaying=True)
                self.protocol.handle(P.PolicyAnnounced(announcement), replaying=True)
            elif kind == "group":
                subject, version, received, planted = extra
                submission = Submission.from_bytes(data)
                if planted:
                    self.protocol.handle(P.Planted(submission, subject, version), replaying=True)
                # The header only: its records are decoded (signatures checked) if a check or a
                # training step asks for them (_body), not for every group the store ever held.
                index = Rollout.from_bytes(submission.records[0]).group_index
                self.protocol.handle(P.GroupReceived(Group(submission, (), subject, version, index), received),
                                     replaying=True)
            elif kind == "verdict":
                try:
                    verdict = SignedVerdict.from_bytes(data)
                except MessageError as error:  # a version 1 verdict (specs/network.md §3.2)
                    raise earlier_protocol("verdict", error) from None
                self.protocol.handle(P.VerdictReceived(verdict), replaying=True)
            elif kind == "step":
                self.protocol.handle(P.StepVerdictReceived(StepVerdict.from_bytes(data)), replaying=True)
            elif kind == "trained":
                version, groups = extra
                announcement = self.store.policy(version)
                if announcement is not None:
                    self.protocol.handle(P.Trained(announcement, groups), replaying=True)

    async def _bootstrap_policy(self) -> None:
        """The trainer announces its current weights unless the store already has them:
        version 0 at the first start, or the checkpoint a crash left unannounced."""
        assert self.trainer is not None
        if self.trainer.version in self.protocol.policies:
            announcement = self.protocol.policies[self.trainer.version]
            model = await self._in_model_thread("load", self.trainer.policy)
            self.work.install(announcement.version, self.trainer.frozen_copy(model),
                              self.config.protocol.max_staleness + 1)
            path = self.blob_dir / announcement.blob.hex()
            if path.exists():
                self.blobs.put(path.read_bytes())
            await self._feed(P.PolicyLoaded(announcement.version))
            return
        step = await self._in_model_thread("serialize", self.trainer.current)
        metrics = await self._in_model_thread("evaluate", self.trainer.trainer.evaluate, step.model)
        await self._announce(dataclasses.replace(step, metrics=metrics))

    async def run(self, stop: asyncio.Event) -> None:
        self._replay()
        self.log.info("replayed store", **self.store.counts(), version=self.protocol.version)
        for topic in (TOPIC_POLICIES, TOPIC_GROUPS, TOPIC_VERDICTS, TOPIC_STEPS):
            self.transport.subscribe(topic, self._on_message, self._validate)
        self.transport.set_handler(BACKFILL_PROTOCOL, self._serve_backfill)
        if self.config.zk.hidden_states:
            self.transport.set_handler(SAMPLING_PROTOCOL, self._serve_sampling)
        for path in self.blob_dir.iterdir():
            if len(path.name) == 64:
                self.blobs.put(path.read_bytes())
        if self.config.metrics_port:
            port = self.metrics.serve(self.config.metrics_port)
            self.log.info("metrics", url=f"http://127.0.0.1:{port}/metrics")
        await self.connect_bootstrap()
        await self.backfill()
        if self.trainer is not None:
            await self._bootstrap_policy()
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
            self._stopping = True
            for task in list(self._tasks):
                task.cancel()
            await asyncio.gather(*self._tasks, return_exceptions=True)
            self._model_thread.shutdown(wait=True, cancel_futures=True)
            if self.trainer is not None:
                self.trainer.trainer.trackers.close()
            if self._prover is not None:
                # Not waiting: a proof under way finishes in the child, which then exits
                # (prover_init: it also exits if this process dies first).
                self._prover.shutdown(wait=False, cancel_futures=True)
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
        if (self.protocol.version is not None and version != getattr(self, "_reputation_round", None)
                and not self._feeding):  # else the next tick takes it
            self._reputation_round = version
            self.store.put_reputation(version, [(n, s.score, s.check_rate, s.quarantined, s.trust, s.checked_groups)
                                                for n, s in standings.items()], at=time.time())
