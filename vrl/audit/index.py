"""The audit's first pass (the ``signatures`` check, specs/audit.md §3): one streamed read of
every store that checks every signature and keeps a compact index of the log.

The index holds the headers of the groups (digest, signer, version, arrival), the policy
announcements, and each verdict's few fields, never a record's bytes; every other check
(:mod:`vrl.audit.checks`, :mod:`vrl.audit.reexecute`) reads it, and fetches a group's records by
digest, one group at a time, only when it re-executes something. So memory grows with the
number of messages (about 630 bytes each, measured by bench/audit.py: specs/audit.md §6), not
with the bytes of the log.

Who a finding incriminates is derived from signatures, never from a field a message asserts
(specs/security.md §1): a group's node is the signer of its records.
"""

from __future__ import annotations

import hashlib
import json
import math
from collections import Counter
from collections.abc import Callable, Iterator
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Protocol, TypeVar

from vrl.audit.findings import Finding, Severity
from vrl.audit.sources import Inputs, NodeInput
from vrl.node.committee import CommitteeError, ManifestContent, PagedManifest
from vrl.node.config import NODE_OVERRIDES, NodeConfig
from vrl.node.messages import (
    Batch,
    BatchFile,
    Group,
    ManifestLists,
    MessageError,
    PolicyAnnouncement,
    RoundManifest,
    SignedVerdict,
    StepVerdict,
    Submission,
    decode_group,
)
from vrl.node.params import ProtocolParams
from vrl.node.protocol import drawn
from vrl.rollouts.files import RolloutFileError, iter_records
from vrl.rollouts.record import RecordError, Rollout


def short(node: bytes) -> str:
    return node.hex()[:8]


class _SignedMessage(Protocol):
    def valid(self) -> bool: ...


_Signed = TypeVar("_Signed", bound=_SignedMessage)  # a signed message type that _signed decodes


@dataclass(frozen=True, slots=True)
class GroupHead:
    subject: bytes  # the signer of its records (decode_group), not the store's column
    version: int
    index: int
    received: float
    planted: bool
    store: int  # which input holds its bytes


@dataclass(frozen=True, slots=True)
class VerdictHead:
    verifier: bytes
    group: bytes
    outcome: str
    reasons: tuple[str, ...]
    digest: bytes
    platform: str
    planted: bool
    policy_version: int
    round: int
    received: float
    id: bytes
    race_tokens: int = 0  # the sequential test's evidence (specs/verification.md §7)
    races_lost: int = 0
    drawn: bool = False  # its own ticket drew the check at its rate (vrl.node.protocol.drawn)
    draw: str = "ticket"  # the claim it carries (specs/committee.md §4), and its VRF proof
    pi: bytes = b""
    seat: int = 0  # its place in the round's groups list and its path; its weights entry and path
    seat_path: tuple[bytes, ...] = ()
    weight_at: int = 0
    weight: int = 0
    weight_path: tuple[bytes, ...] = ()


@dataclass
class StoreIndex:
    """What one store holds, compactly."""

    node: NodeInput
    groups: dict[bytes, GroupHead] = field(default_factory=dict)
    policies: dict[int, PolicyAnnouncement] = field(default_factory=dict)
    verdicts: list[VerdictHead] = field(default_factory=list)  # in received order
    steps: list[StepVerdict] = field(default_factory=list)
    trained: dict[int, tuple[tuple[bytes, ...], dict[str, Any]]] = field(default_factory=dict)
    announced_at: dict[int, float] = field(default_factory=dict)  # when this node received each version
    # Round manifests (the committee design) signed by their trainer: round -> (manifest, received).
    manifests: dict[int, tuple[RoundManifest, float]] = field(default_factory=dict)
    # The lists behind them (the trainer's own store holds them): round -> its lists, each
    # proven to give its manifest's header.
    lists: dict[int, ManifestContent] = field(default_factory=dict)


@dataclass
class Run:
    """The run as the audit sees it: every input's index, and what follows from them."""

    inputs: Inputs
    stores: list[StoreIndex]
    trainer: bytes | None
    config: NodeConfig | None  # the network's settings, from the first node folder with a node.toml
    policies: dict[int, PolicyAnnouncement]  # the trainer's, one per version (equivocations are findings)
    groups: dict[bytes, GroupHead]  # every group any store holds
    planted: set[bytes]  # groups the trainer planted (its store's column, or its "planted" verdict)
    canaries: set[bytes] = field(default_factory=set)  # the throw-away identities that signed them
    trained_groups: set[bytes] = field(default_factory=set)  # every group some announced batch lists
    # Each announced step's batch: listed in its announcement, or from the batch file it names
    # (specs/network.md §3.3.1) found in some node folder; a version whose file is absent or no
    # batch of it is left out (a finding says which).
    batches: dict[int, Batch] = field(default_factory=dict)
    rollout_records: int = 0
    series: dict[str, Any] = field(default_factory=dict)  # what the HTML report plots, filled by the checks
    stats: dict[str, Any] = field(default_factory=dict)  # per check: what it looked at

    @property
    def protocol(self) -> ProtocolParams:
        """The network's [protocol] table: its node.toml's, or without one among the inputs what a
        node runs when its node.toml sets none (vrl.node.config.NODE_OVERRIDES)."""
        if self.config is not None:
            return self.config.protocol
        defaults: dict[str, Any] = NODE_OVERRIDES.get("protocol", {})  # ProtocolParams' own keys and types
        return ProtocolParams(**defaults)

    def group_bytes(self, digest: bytes) -> bytes | None:
        """A group's bytes by digest from any store, hashed again: a row filed under a digest
        that is not its own is passed over (the signatures check reports it)."""
        head = self.groups.get(digest)
        order = ([self.stores[head.store]] if head is not None else []) + self.stores
        for index in order:
            data = index.node.store.group(digest)
            if data is None:
                continue
            try:
                if Submission.from_bytes(data).digest == digest:
                    return data
            except MessageError:
                continue
        return None

    def decoded(self, digest: bytes) -> Group | None:
        """A group by digest, its records decoded. A group the signatures pass accepted
        (:attr:`groups`) is not checked again: its bytes hash to the digest whose records were
        verified there, so their signatures are those; any other is decoded in full."""
        data = self.group_bytes(digest)
        head = self.groups.get(digest)
        if data is None:
            return None
        try:
            if head is None:
                return decode_group(data)
            submission = Submission.from_bytes(data)
            return Group(submission, tuple(submission.rollouts()), head.subject, head.version, head.index)
        except (MessageError, RecordError):
            return None  # the signatures check has already said so, with the store and the row


Progress = Callable[[str, int], None]  # (what, items done since the last call)


def finding(check: str, code: str, severity: Severity, sentence: str, subject: bytes = b"", **evidence: Any) -> Finding:
    return Finding(check, code, severity, sentence, subject.hex() if subject else "", evidence)


def index_run(inputs: Inputs, progress: Progress, findings: list[Finding]) -> Run:
    """One streamed pass over every input: every signature checked (the ``signatures``
    check's findings go to ``findings``), and the run's index built."""
    check = "signatures"
    stores = []
    config = next((n.config for n in inputs.nodes if n.config is not None), None)
    trainer = bytes.fromhex(config.trainer) if config is not None else None
    for node in inputs.nodes:
        if node.config is not None and config is not None and (node.config.trainer, node.config.work) != (
                config.trainer, config.work):
            findings.append(finding(check, "config_disagrees", Severity.WARNING,
                                    f"{node.name}'s node.toml names another trainer or [work] table than "
                                    f"{inputs.nodes[0].name}'s; the audit follows the first", node=node.name))
    checked: Counter[str] = Counter()
    for number, node in enumerate(inputs.nodes):
        index = StoreIndex(node)
        where = str(node.store.path)
        for column, data, received in node.store.policies():
            checked["policies"] += 1
            a = _signed(PolicyAnnouncement.from_bytes, data, "policy announcement", where, findings)
            if a is None:
                continue
            if a.version != column:
                findings.append(finding(check, "column_mismatch", Severity.ERROR,
                                        f"{where}: the announcement of version {a.version} is stored as version "
                                        f"{column}", store=where, version=a.version))
                continue
            index.policies[a.version] = a
            index.announced_at[a.version] = received
        for column, data, received in node.store.manifests():
            checked["manifests"] += 1
            m = _signed(RoundManifest.from_bytes, data, "round manifest", where, findings)
            if m is None:
                continue
            if m.round != column:
                findings.append(finding(check, "column_mismatch", Severity.ERROR,
                                        f"{where}: the manifest of round {m.round} is stored as round {column}",
                                        store=where, round=m.round))
                continue
            index.manifests[m.round] = (m, received)
        for column, data in node.store.manifest_lists():
            try:
                lists = ManifestLists.from_bytes(data)
            except MessageError as error:
                findings.append(finding(check, "undecodable", Severity.ERROR, f"{where}: the lists of round {column} "
                                        f"do not decode: {error}", store=where, round=column))
                continue
            held = index.manifests.get(lists.round)
            try:
                header = PagedManifest(lists.content).header
            except CommitteeError:  # lists no header can commit (no group at all)
                header = None
            if lists.round != column or held is None or header != held[0].header:
                findings.append(finding(check, "lists_mismatch", Severity.ERROR,
                                        f"{where}: the lists stored for round {column} are not those its signed "
                                        f"manifest commits", held[0].trainer if held else b"", store=where,
                                        round=column))
                continue
            index.lists[lists.round] = lists.content
        for digest, data, subject, version, planted, received in node.store.groups():
            checked["groups"] += 1
            progress("signatures", 1)
            try:
                group = decode_group(data)
            except MessageError as error:
                findings.append(finding(check, "bad_signature" if "signature" in str(error) else "undecodable",
                                         Severity.ERROR, f"{where}: group {digest.hex()[:16]} was stored though it "
                                         f"does not decode ({error})", store=where, group=digest.hex()))
                continue
            checked["records"] += len(group.rollouts)
            if (group.digest, group.subject, group.version) != (digest, subject, version):
                findings.append(finding(check, "column_mismatch", Severity.ERROR,
                                         f"{where}: group {digest.hex()[:16]}'s stored digest, signer or version is "
                                         f"not its records'", store=where, group=digest.hex()))
                continue
            index.groups[group.digest] = GroupHead(group.subject, group.version, group.index, received, planted,
                                                   number)
        for data, received in node.store.verdicts():
            checked["verdicts"] += 1
            v = _signed(SignedVerdict.from_bytes, data, "verdict", where, findings)
            if v is None:
                continue
            index.verdicts.append(VerdictHead(v.verifier, v.group, str(v.outcome), v.reasons, v.digest, v.platform,
                                              v.planted, v.policy_version, v.round, received, v.id,
                                              v.race_tokens, v.races_lost, drawn(v), str(v.draw), v.pi, v.seat,
                                              v.seat_path, v.weight_at, v.weight, v.weight_path))
        for data, _ in node.store.steps():
            checked["step verdicts"] += 1
            step = _signed(StepVerdict.from_bytes, data, "step verdict", where, findings)
            if step is not None:
                index.steps.append(step)
        for version, digests, metrics in node.store.trained():
            try:
                values = json.loads(metrics)
            except ValueError:
                values = {}
            # Only the numbers a trainer writes; anything else in the column is no claim at all.
            numbers = {k: v for k, v in values.items() if isinstance(v, (int, float)) and not isinstance(v, bool)
                       and math.isfinite(v)} if isinstance(values, dict) else {}
            index.trained[version] = (digests, numbers)
        for table, rowid in dict.fromkeys(node.store.damaged):  # each damaged row once, however often read
            findings.append(finding(check, "damaged_row", Severity.ERROR,
                                     f"{where}: row {rowid} of table {table} is not what a node writes there "
                                     f"(a column of the wrong type or size); it is skipped", store=where,
                                     table=table, row=rowid))
        stores.append(index)
    if trainer is None:  # no node.toml: the network's trainer is whoever signed version 0
        signers = Counter(a.trainer for s in stores for v, a in s.policies.items() if v == 0)
        trainer = signers.most_common(1)[0][0] if signers else None
    run = Run(inputs, stores, trainer, config, {}, {}, set())
    for index in stores:
        # Which groups were planted: the trainer's signed reveal, or the planted column of the
        # trainer's own store (its last round's plants are never revealed, since no batch follows;
        # the column is the trainer's word about itself, worth what its signed reveal is), never
        # another store's column, which that store's owner can set.
        own = index.node.owner == trainer and trainer is not None
        for digest, head in index.groups.items():
            run.groups.setdefault(digest, head)
            if own and head.planted:
                run.planted.add(digest)
        for head_v in index.verdicts:
            # The trainer reveals its plants with a signed hard fail whose reason is "planted".
            if head_v.verifier == trainer and head_v.planted:
                run.planted.add(head_v.group)
    run.canaries = {run.groups[d].subject for d in run.planted if d in run.groups}
    _policies_and_equivocation(run, findings)
    _batches(run, findings)
    run.trained_groups = {d for batch in run.batches.values() for d, _ in batch}
    _rollout_files(run, findings, checked)
    run.stats[check] = dict(checked)
    return run


def _signed(decode: Callable[[bytes], _Signed], data: bytes, what: str, where: str,
            findings: list[Finding]) -> _Signed | None:
    """A stored signed message decoded and its signature checked, or None and a finding."""
    try:
        message = decode(data)
    except MessageError as error:
        findings.append(finding("signatures", "undecodable", Severity.ERROR,
                                f"{where}: a stored {what} does not decode ({error})", store=where))
        return None
    if not message.valid():
        # Its id where it has one (a verdict, an announcement); a round manifest has none: its bytes' hash.
        ident = getattr(message, "id", None)
        ident = ident if isinstance(ident, bytes) else hashlib.sha256(data).digest()
        findings.append(finding("signatures", "bad_signature", Severity.ERROR,
                                f"{where}: {what} {ident.hex()[:16]} is not signed by the key it names",
                                store=where, id=ident.hex()))
        return None
    return message


def _policies_and_equivocation(run: Run, findings: list[Finding]) -> None:
    """The trainer's announcements across stores: one per version, or a signed contradiction."""
    seen: dict[int, PolicyAnnouncement] = {}
    for index in run.stores:
        for version, a in index.policies.items():
            if a.trainer != run.trainer:
                findings.append(finding("signatures", "foreign_policy", Severity.WARNING,
                                         f"{index.node.store.path}: version {version} is announced by "
                                         f"{short(a.trainer)}, not the network's trainer", a.trainer, version=version))
                continue
            first = seen.setdefault(version, a)
            if first.id != a.id:
                findings.append(finding("signatures", "trainer_equivocation", Severity.ERROR,
                                         f"the trainer signed two different announcements of version {version} "
                                         f"({first.id.hex()[:12]} and {a.id.hex()[:12]})", a.trainer,
                                         version=version, announcements=[first.id.hex(), a.id.hex()]))
    run.policies = dict(sorted(seen.items()))


def _batches(run: Run, findings: list[Finding]) -> None:
    """Every announced batch: inline, or the batch file the announcement names, from any node
    folder that holds it (the trainer's does: it wrote it; a replayer's, which fetched it)."""
    for version, a in run.policies.items():
        if a.inline is not None:
            run.batches[version] = a.inline
            continue
        data = run.inputs.blob(a.batch_file)
        if data is None:
            findings.append(finding("signatures", "batch_file_missing", Severity.WARNING,
                                    f"version {version}'s batch file {a.batch_file.hex()[:16]} is in no node folder: "
                                    "its batch is not audited", a.trainer, version=version))
            continue
        try:
            run.batches[version] = BatchFile.of(a, data)
        except MessageError as error:
            findings.append(finding("signatures", "bad_batch", Severity.ERROR,
                                    f"version {version}'s batch file is not its batch: {error}", a.trainer,
                                    version=version))


def file_records(path: Path | str, findings: list[Finding]) -> Iterator[Rollout | RecordError]:
    """A rollout file's records; a file that became unreadable since it was opened is a finding."""
    try:
        yield from iter_records(path)
    except RolloutFileError as error:
        findings.append(finding("signatures", "damaged_file", Severity.WARNING, str(error), file=str(path)))


def _rollout_files(run: Run, findings: list[Finding], checked: Counter[str]) -> None:
    for path in run.inputs.rollout_files:
        for item in file_records(path, findings):
            if isinstance(item, RecordError):
                findings.append(finding("signatures", "damaged_file", Severity.WARNING,
                                         f"{path}: {item}", file=str(path)))
                continue
            checked["file records"] += 1
            run.rollout_records += 1
            if not item.signature_valid():
                findings.append(finding("signatures", "bad_signature", Severity.ERROR,
                                         f"{path}: record {item.task_id} sample {item.sample_index} of "
                                         f"{short(item.node_id)} is not signed by the node it names",
                                         file=str(path), node=item.node_id.hex()))
