"""Every zk duty of a node, and the prover process they run in.

- Sampling proofs between nodes (specs/network.md §3.4, specs/zk.md §10): a worker keeps the
  rows of its own groups' records on disk (witness files, pruned) and answers a verifier's
  challenge once per asking peer and group; a verifier challenges a group's producer after
  the group passed its check, and checks the answer.
- Reward proofs of a network of private tasks (specs/zk.md §11): the trainer proves each
  trained record's correctness; every node checks those proofs when it replays a step.

:func:`sampling_setup` and :func:`private_setup` are the start-up checks of the ``[zk]``
table that need the model or the task set.
"""

from __future__ import annotations

import asyncio
import functools
import hashlib
import multiprocessing
import time
from collections import OrderedDict
from collections.abc import Callable
from concurrent.futures import ProcessPoolExecutor
from concurrent.futures.process import BrokenProcessPool
from pathlib import Path
from typing import TYPE_CHECKING, TypeVar, TypeVarTuple

import structlog

from p2p.transport import MAX_RESPONSE_BYTES, Transport, TransportError
from proofs.zk import Srs, ZkError
from vrl.config import ConfigError
from vrl.node.blobs import Blobs
from vrl.node.config import NodeConfig, ZkConfig
from vrl.node.groups import GroupCache
from vrl.node.messages import Group, MessageError, StepFault, audit_ticket
from vrl.node.metrics import NodeMetrics
from vrl.node.requests import SamplingRequest
from vrl.node.work import ModelThread, Work
from vrl.rollouts.keys import NodeKey
from vrl.rollouts.model import Model
from vrl.tasks import TaskList
from vrl.zk.sampling import SamplingProofError, answer_challenge, head_weight, prover_init, write_witness

if TYPE_CHECKING:
    from vrl.zk import AnswerKey

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

# The SRS proofs are made and checked against, and the zk directory that holds the circuits
# and keys.
Setup = tuple[Srs, Path]

T = TypeVar("T")
Ts = TypeVarTuple("Ts")


def sampling_setup(config: NodeConfig, model: Model) -> Setup:
    """The SRS sampling proofs use here (the [zk] table), once its policy is known to have a
    circuit and an answer to fit the transport's response limit."""
    from proofs import zk
    from vrl.zk.sampling import circuit_for

    try:
        circuit = circuit_for(model)
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


def private_setup(config: NodeConfig, tasks: TaskList) -> tuple[AnswerKey | None, Setup]:
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
            key.check(tasks.tasks)
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


class Prover:
    """A process of its own that proofs are made in. Proving takes seconds a position and
    ezkl holds the GIL meanwhile (2.8 s of 3.2 s, measured): in a thread it stalled the event
    loop, and libp2p dropped the node's connections (bench/devnet.py zk). So it runs in a
    process of its own, started on the first request and kept."""

    def __init__(self, metrics: NodeMetrics) -> None:
        self.metrics = metrics
        self.pool: ProcessPoolExecutor | None = None
        self.lock: asyncio.Lock | None = None  # one job in the prover process at a time

    async def run(self, kind: str, fn: Callable[[*Ts], T], *args: *Ts) -> T:
        """``fn(*args)`` in the prover process, one job at a time: a job whose caller gave up
        while it waited (a verifier's timeout) is cancelled here, before it costs any proving.
        A prover that died (out of memory, killed) raises BrokenProcessPool, and a fresh one
        serves the next job."""
        if self.lock is None:
            self.lock = asyncio.Lock()
        async with self.lock:
            if self.pool is None:
                self.pool = ProcessPoolExecutor(1, mp_context=multiprocessing.get_context("spawn"),
                                                initializer=prover_init)
            started = time.perf_counter()
            try:
                return await asyncio.get_running_loop().run_in_executor(self.pool, fn, *args)
            except BrokenProcessPool:
                self.pool = None
                raise
            finally:
                self.metrics.step_seconds.labels(kind).observe(time.perf_counter() - started)

    def close(self) -> None:
        if self.pool is not None:
            # Not waiting: a proof under way finishes in the child, which then exits
            # (prover_init: it also exits if this process dies first).
            self.pool.shutdown(wait=False, cancel_futures=True)


class Answers:
    """A worker's bookkeeping of the sampling answers it gave: one per asking peer and group
    (MAX_SERVED pairs remembered), and the last answers themselves (MAX_KEPT_ANSWERS), sent
    again as they are when the same question comes again."""

    def __init__(self, max_served: int = MAX_SERVED, max_kept: int = MAX_KEPT_ANSWERS) -> None:
        self.max_served, self.max_kept = max_served, max_kept
        self.served: OrderedDict[tuple[bytes, bytes], None] = OrderedDict()
        # The last answers sent, by (peer, group, challenge, positions), sent again as they are.
        self.kept: OrderedDict[tuple[bytes, bytes, bytes, int], bytes] = OrderedDict()

    def kept_answer(self, request: SamplingRequest, peer: bytes) -> bytes | None:
        """The answer already sent to this very question, if it is kept."""
        return self.kept.get((peer, request.group, request.challenge, request.positions))

    def admit(self, request: SamplingRequest, peer: bytes) -> None:
        """Count a new question; raises MessageError if this peer had its answer on the group."""
        if (peer, request.group) in self.served:
            raise MessageError("sampling request: this group was answered to this peer already")
        self.served[peer, request.group] = None
        while len(self.served) > self.max_served:
            self.served.popitem(last=False)

    def keep(self, request: SamplingRequest, peer: bytes, answer: bytes) -> None:
        self.kept[peer, request.group, request.challenge, request.positions] = answer
        while len(self.kept) > self.max_kept:
            self.kept.popitem(last=False)


class Proving:
    """One node's zk duties. ``sampling`` and ``rewards`` are the setups of sampling proofs
    and of a private task set's reward proofs (None where the node has none); ``answer_key``
    is a private set's trainer's."""

    def __init__(self, zk: ZkConfig, directory: Path, key: NodeKey, transport: Transport, work: Work,
                 groups: GroupCache, blobs: Blobs, model_thread: ModelThread, metrics: NodeMetrics,
                 log: structlog.BoundLogger, *, sampling: Setup | None = None, rewards: Setup | None = None,
                 answer_key: AnswerKey | None = None) -> None:
        self.zk, self.directory, self.key, self.transport, self.work = zk, directory, key, transport, work
        self.groups, self.blobs, self.model_thread, self.log = groups, blobs, model_thread, log
        self.sampling, self.rewards, self.answer_key = sampling, rewards, answer_key
        self.prover = Prover(metrics)
        self.answers = Answers()
        self.stopping = False

    def close(self) -> None:
        self.stopping = True
        self.prover.close()

    # -- witness files: a worker's rows of its own groups ------------------------------------
    def witness_path(self, digest: bytes) -> Path:
        return self.directory / "hidden" / f"{digest.hex()}.hidden"

    async def keep_rows(self, groups: list[Group]) -> None:
        """Write the rows of freshly generated ``groups`` to disk (before they are published),
        and prune the oldest."""
        if not self.zk.hidden_states:
            return
        for group in groups:
            await asyncio.to_thread(write_witness, self.witness_path(group.digest), self.work.take_rows(group))
        await asyncio.to_thread(self.prune_witness)

    def prune_witness(self) -> None:
        """Keep the rows of the last MAX_WITNESS_FILES groups: a group older than that is of a
        version no verifier still checks (max_staleness), so no challenge can come for it."""
        files = sorted((self.directory / "hidden").glob("*.hidden"), key=lambda p: p.stat().st_mtime)
        for path in files[:-MAX_WITNESS_FILES]:
            path.unlink(missing_ok=True)

    # -- sampling proofs between nodes (specs/network.md §3.4) -------------------------------
    async def challenge(self, group: Group, version: int) -> tuple[str, ...] | None:
        """Ask ``group``'s producer to prove the positions this verifier's audit ticket picks, and
        check the answer: a refusal, a reset, no answer in time, or none that decodes fails like
        a bad proof. None (no verdict) only when the producer is not connected when asked:
        unreached is not unanswered, and a sparse network must not make an honest producer look
        a cheat. Once the request is on its way, nothing the producer does is "unreached". A
        failure of this verifier's own (ezkl, here) is no verdict either; asked again, the
        producer sends the same answer."""
        positions = self.zk.sampling_positions
        if group.subject not in self.transport.peers():  # dropped since the check looked
            return None
        model = self.work.models.get(version)  # taken now: the answer may come after the version is let go
        if model is None:
            return None
        challenge = hashlib.sha256(audit_ticket(self.key, group.digest)).digest()
        request = SamplingRequest(group.digest, challenge, positions)
        try:
            answer = await self.transport.request(
                group.subject, SAMPLING_PROTOCOL, request.to_bytes(), timeout=self.zk.proof_timeout,
                max_response=len(group.rollouts) * positions * MAX_OPENING_BYTES + 1024)
        except TransportError as error:
            self.log.warning("no sampling proofs", group=group.digest.hex()[:12],
                             producer=group.subject.hex()[:8], error=type(error).__name__)
            return ("sampling_missing",)
        assert self.sampling is not None  # the daemon challenges only where its config asks for sampling proofs
        srs, workdir = self.sampling
        try:
            return await self.model_thread.run("sampling proofs", self.work.check_sampling, group, model, answer,
                                               challenge, positions, srs, workdir)
        except (ZkError, SamplingProofError) as error:  # ezkl failing here: this verifier's own problem
            self.log.warning("sampling proofs not checked", group=group.digest.hex()[:12], error=str(error))
            return None

    async def serve_sampling(self, peer: bytes, data: bytes) -> bytes:
        """Prove positions of one of this node's own groups, once per asking peer and group; a
        request no honest verifier sends counts against its sender."""
        try:
            request = SamplingRequest.from_bytes(data)
        except MessageError:
            self.transport.penalize(peer)
            raise
        if self.stopping:
            raise MessageError("sampling request: this node is stopping")
        group = self.groups.body(request.group)
        if group is None or group.subject != self.key.node_id or request.positions > self.zk.max_positions:
            raise MessageError("sampling request: not a group of this node's, or more positions than it proves")
        kept = self.answers.kept_answer(request, peer)
        if kept is not None:  # the same question again: the same answer, no new proofs
            return kept
        self.answers.admit(request, peer)
        model = self.work.models.get(group.version)  # taken now: the version may be let go while it waits
        if model is None:
            raise MessageError(f"sampling request: version {group.version} is no longer held here")
        assert self.sampling is not None  # served only where the config keeps hidden states, which need the SRS
        srs, workdir = self.sampling
        try:
            answer = await self.prover.run("prove", answer_challenge, head_weight(model), group.rollouts,
                                           self.witness_path(request.group), request.challenge, request.positions,
                                           srs, workdir)
        except (SamplingProofError, ZkError) as error:
            raise MessageError(f"sampling request: {error}") from None
        except BrokenProcessPool:
            raise MessageError("sampling request: the prover process died") from None
        except Exception as error:  # noqa: BLE001 (pickling, spawning: the prover's failure, named)
            raise MessageError(f"sampling request: the prover failed ({type(error).__name__})") from None
        self.answers.keep(request, peer, answer)
        self.log.info("sampling proofs sent", group=request.group.hex()[:12], to=peer.hex()[:8],
                      positions=request.positions * len(group.rollouts))
        return answer

    # -- reward proofs of private tasks (specs/zk.md §11) ------------------------------------
    async def prove_rewards(self, groups: list[Group]) -> tuple[list[list[float]], tuple[bytes, int]]:
        """The rewards a step of private tasks trains on, and the proofs file that shows them
        (stored and served, by hash and size): one answer-match proof per distinct answer to a
        task, made in the prover process (specs/zk.md §11). The trainer checks its own proofs
        as a verifier will, and trains on what they show."""
        from vrl.zk import attachments_bytes, named_proofs, proof_plan, prove_statements, training_rewards

        # Asked of the trainer of a private task set only, which holds the key and the setup.
        assert self.rewards is not None and self.answer_key is not None
        srs, workdir = self.rewards
        decode = self.work.skeleton.decode
        records = [list(g.rollouts) for g in groups]
        statements, named = await self.model_thread.run("plan proofs", proof_plan,
                                                        [r for g in records for r in g], self.answer_key, decode)
        started = time.perf_counter()
        proofs = await self.prover.run("prove rewards", prove_statements, statements, srs, workdir)
        proving = time.perf_counter() - started
        attachments = named_proofs(proofs, named)
        rewards, failures = await self.model_thread.run(
            "check proofs", functools.partial(training_rewards, allow_dev=srs.dev), records, attachments, decode,
            [srs], workdir)
        if failures:  # never an honest trainer's: ezkl or the SRS failing here
            raise RuntimeError(f"{len(failures)} of its own reward proofs fail: {sorted(set(failures.values()))}")
        self.log.info("rewards proven", records=sum(map(len, records)), proofs=len(statements),
                      attachments=len(attachments), seconds=round(proving, 2))
        if not attachments:
            return rewards, (b"", 0)
        blob = attachments_bytes(attachments)
        return rewards, (self.blobs.keep(blob), len(blob))

    def step_rewards(self, groups: list[Group], proofs: bytes) -> tuple[list[list[float]], tuple[str, ...]]:
        """What a step of private tasks must have trained on, from the proofs file its
        announcement binds (vrl.zk.step_rewards), and ``(REWARD_UNPROVEN,)`` when a record's
        proof is missing or fails: the step is at fault."""
        from vrl.zk import step_rewards

        assert self.rewards is not None  # asked on a network of private tasks only, which has the setup
        srs, workdir = self.rewards
        rewards, fault = step_rewards([list(g.rollouts) for g in groups], proofs, self.work.skeleton.decode, [srs],
                                      workdir, allow_dev=srs.dev)
        if fault is not None:
            self.log.warning("reward proofs fail", reason=fault)
        return rewards, () if fault is None else (StepFault.REWARD_UNPROVEN,)
