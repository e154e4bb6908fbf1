"""Fuzz targets: every decoder and message handler that reads what a stranger sends.

One list serves two runs: ``tests/test_fuzz.py`` runs each target briefly in the suite, and
``bench/fuzz.py`` runs the same targets at depth and prints a table. A target is a function
of raw bytes and the error types it may refuse with (its module's own). Each gets two
Hypothesis strategies: raw bytes, and valid inputs mutated (a field replaced by a hostile
value, removed or doubled with a foreign key, or bytes flipped, cut or repeated).

A case ends one of three ways: a value, a refusal (one of the target's errors), or a crash:
any other exception, or a case slower than :data:`CASE_SECONDS`. The property is "no
crash"; a target may also check that nothing accepted before was lost (the node targets do).
"""

from __future__ import annotations

import asyncio
import dataclasses
import enum
import hashlib
import json
import math
import re
import shutil
import sqlite3
import time
import tomllib
from collections import Counter
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import msgpack
import tomli_w
from hypothesis import strategies as st

from proofs import vrf
from proofs.sampler import SamplingParams
from vrl.node import committee, deltas
from vrl.node.config import ConfigError, NodeConfig
from vrl.node.deltas import DeltaError
from vrl.node.messages import (
    ManifestLists,
    MessageError,
    PolicyAnnouncement,
    RoundManifest,
    SignedVerdict,
    StepVerdict,
    Submission,
    audit_ticket,
    decode_group,
)
from vrl.node.requests import BackfillPage, BackfillRequest, EntriesAnswer, EntriesRequest, SamplingRequest
from vrl.rl.checkpoint import CheckpointError, parse_manifest
from vrl.rl.step import StepConfig, StepError, load_optimizer_bytes, optimizer_bytes, optimizer_for
from vrl.rollouts.files import FILE_MAGIC, RolloutFileError, frame, records_from_bytes
from vrl.rollouts.keys import NodeKey
from vrl.rollouts.record import RecordError, Rollout
from vrl.tasks import RewardSpec
from vrl.tasks.files import TaskFileError, task_from_line
from vrl.zk.sampling import Opening, SamplingProofError, openings_bytes, openings_from_bytes

#: A case slower than this is a crash: every decoder here is linear in its input, and the
#: largest input a strategy makes is ~64 KiB (a decode of that takes well under 50 ms here).
CASE_SECONDS = 2.0

KEY = NodeKey.from_seed(hashlib.sha256(b"vrl fuzz key").digest())
TRAINER = NodeKey.from_seed(hashlib.sha256(b"vrl fuzz trainer").digest())


# -- valid inputs ---------------------------------------------------------------------------------

def rollout(index: int = 0, size: int = 2, **changes: Any) -> Rollout:
    fields = dict(
        node_id=KEY.node_id, model_hash=hashlib.sha256(b"model").digest(), policy_version=0,
        round_seed=bytes(range(32)), group_index=0, task_id="add-2-3", sample_index=index, group_size=size,
        prompt="2+3=", reference="5", prompt_tokens=(50, 43, 51, 61), completion_tokens=(53, 256),
        finish_reason="stop", sampling=SamplingParams(1.0, 0, 1.0, 64, (256,)), behaviour_logprobs=(-0.5, -1.25),
        reward=1.0, reward_spec=RewardSpec(), commitment=b"\x01\x20\x03" + bytes(8))
    fields.update(changes)
    return Rollout(**fields).signed(KEY)


def lists_example() -> committee.ManifestContent:
    """A round's lists (specs/committee.md §3.1): three groups of two workers, two weights."""
    table = committee.WeightsTable(13, tuple(sorted(((KEY.node_id, 65536), (TRAINER.node_id, 1)))))
    return committee.ManifestContent(7, table, tuple(sorted(bytes([i]) * 32 for i in range(3))),
                                     tuple(sorted(((KEY.node_id, 2), (TRAINER.node_id, 1)))))


def group(size: int = 2) -> Submission:
    return Submission.of([rollout(i, size) for i in range(size)])


def verdict(outcome: str = "hard_fail", **changes: Any) -> SignedVerdict:
    sub = group()
    fields = dict(verifier=KEY.node_id, subject=KEY.node_id, group=sub.digest, round=3, policy_version=0,
                  ticket=audit_ticket(KEY, sub.digest), rate=1.0, outcome=outcome,
                  reasons=("reward_mismatch",) if outcome == "hard_fail" else (),
                  digest=b"" if outcome == "skipped" else b"\x05" * 32, platform="torch-2.13.0/cpu/float32/threads-1")
    fields.update(changes)
    return SignedVerdict(**fields).signed(KEY)


def policy(version: int = 0) -> PolicyAnnouncement:
    if version == 0:
        return PolicyAnnouncement(TRAINER.node_id, version, b"\x01" * 32, b"\x02" * 32, 4096).signed(TRAINER)
    return PolicyAnnouncement(TRAINER.node_id, version, b"\x01" * 32, b"\x02" * 32, 4096, parent=b"\x03" * 32,
                              batch=((group().digest, 1.0), (b"\x04" * 32, 0.25)), config=b"\x05" * 32,
                              optimizer_before=b"\x06" * 32, optimizer=b"\x07" * 32, optimizer_size=999,
                              platform="torch-2.13.0/cpu/float32/threads-1").signed(TRAINER)


def step_verdict(outcome: str = "fraud") -> StepVerdict:
    announcement = policy(1)
    return StepVerdict(KEY.node_id, TRAINER.node_id, 1, announcement.id, outcome,
                       ("weights_mismatch",) if outcome == "fraud" else (), b"\x08" * 32,
                       0.5 if outcome == "fraud" else 0.0, "torch-2.13.0/cpu/float32/threads-1").signed(KEY)


def step_config_file() -> bytes:
    return StepConfig(learning_rate=2e-5, warmup_steps=5, grad_clip=1.0, temperature=1.0,
                      max_new_tokens=16).to_bytes()


def optimizer_file() -> bytes:
    import torch

    linear = torch.nn.Linear(3, 2)
    optimizer = optimizer_for(linear, StepConfig.from_bytes(step_config_file()))
    linear(torch.ones(1, 3)).sum().backward()
    optimizer.step()
    return optimizer_bytes(linear, optimizer)


def load_optimizer_file(data: bytes) -> None:
    import torch

    linear = torch.nn.Linear(3, 2)
    load_optimizer_bytes(linear, optimizer_for(linear, StepConfig.from_bytes(step_config_file())), data)


# -- hostile values and mutations -----------------------------------------------------------------

def hostile_values() -> st.SearchStrategy[Any]:
    """What a stranger can put in any field: range edges, non-finite floats, wrong types,
    deep or wide containers, huge strings."""
    edges = st.sampled_from([0, -1, 1, 2**31, 2**32, 2**53 + 1, 2**63 - 1, 2**63, 2**64 - 1, -(2**63),
                             math.nan, math.inf, -math.inf, -0.0, 5e-324, 1e308, 1e-4, True, False, None,
                             "", "\x00", "é" * 40, b"", b"\x00" * 32, [], {}, [[[[[]]]]], {"": {"": {}}}])
    leaves = (st.integers(-(2**63), 2**64 - 1) | st.floats(allow_nan=True, allow_infinity=True)
              | st.text(max_size=64) | st.binary(max_size=96) | st.booleans() | st.none())
    nested = st.recursive(leaves, lambda inner: st.lists(inner, max_size=4) | st.dictionaries(
        st.text(max_size=8), inner, max_size=4), max_leaves=12)
    deep = st.integers(1, 200).map(lambda depth: _nest(depth))
    big = st.sampled_from([b"\xff" * (64 << 10), "x" * (64 << 10), list(range(4096))])
    return st.one_of(edges, nested, deep, big)


def _nest(depth: int) -> Any:
    value: Any = 0
    for level in range(depth):
        value = [value] if level % 2 else {"k": value}
    return value


def _paths(value: Any, prefix: tuple = ()) -> list[tuple]:
    """Every place inside nested maps and lists (and msgpack bin holding a msgpack map)."""
    found = [prefix] if prefix else []
    if isinstance(value, dict):
        for k, v in value.items():
            found += _paths(v, prefix + (k,))
    elif isinstance(value, list) and len(value) <= 16:
        for i, v in enumerate(value):
            found += _paths(v, prefix + (i,))
    return found


def _replace(value: Any, path: tuple, new: Any, delete: bool = False) -> Any:
    if not path:
        return new
    head, rest = path[0], path[1:]
    copy = dict(value) if isinstance(value, dict) else list(value)
    if delete and not rest:
        del copy[head]
        return copy
    copy[head] = _replace(copy[head], rest, new, delete)
    return copy


@st.composite
def mutated_msgpack(draw: st.DrawFn, seeds: list[bytes]) -> bytes:
    """A valid message, decoded, with one to three fields replaced, removed or added, then
    re-encoded; records nested as bin inside a group are opened and mutated the same way."""
    data = draw(st.sampled_from(seeds))
    value = msgpack.unpackb(data, raw=False)
    for _ in range(draw(st.integers(1, 3))):
        records = value.get("records") if isinstance(value, dict) else None
        if isinstance(records, list) and records and draw(st.booleans()):
            index = draw(st.integers(0, len(records) - 1))
            try:
                inner = msgpack.packb(_mutate(draw, msgpack.unpackb(records[index], raw=False)), use_bin_type=True)
            except Exception:  # an earlier step left no msgpack (or no bytes) there: replace it whole
                inner = draw(hostile_values())
            value = _replace(value, ("records", index), inner)
        else:
            value = _mutate(draw, value)
    try:
        return msgpack.packb(value, use_bin_type=True)
    except (OverflowError, ValueError, TypeError):
        return data  # not representable in msgpack (e.g. 2^64): nobody can send it


def _mutate(draw: st.DrawFn, value: Any) -> Any:
    paths = _paths(value)
    action = draw(st.sampled_from(["replace", "replace", "delete", "add"]))
    if action == "add" or not paths:
        if isinstance(value, dict):
            key = draw(st.sampled_from(["extra", b"extra", "kind", "v", "signature", "\x00"]))
            return {**value, key: draw(hostile_values())}
        return draw(hostile_values())
    path = draw(st.sampled_from(paths))
    return _replace(value, path, draw(hostile_values()), delete=action == "delete")


@st.composite
def mutated_json(draw: st.DrawFn, seeds: list[bytes]) -> bytes:
    """A valid JSON line with fields replaced, removed or added (JSON has no bytes: those
    become text), or replaced whole by deep nesting."""
    value = json.loads(draw(st.sampled_from(seeds)))
    for _ in range(draw(st.integers(1, 3))):
        value = _mutate(draw, value)
    try:
        return json.dumps(value, default=lambda b: b.decode("latin-1"), allow_nan=True).encode()
    except (ValueError, TypeError, RecursionError):
        return b"[" * 100_000  # what json could not write, a stranger can: nesting past any stack


@st.composite
def mutated_toml(draw: st.DrawFn, seeds: list[bytes]) -> bytes:
    """A valid node.toml with keys replaced by hostile values (what TOML can hold: no bytes,
    no null), removed, or added."""
    value = tomllib.loads(draw(st.sampled_from(seeds)).decode())
    for _ in range(draw(st.integers(1, 3))):
        value = _mutate(draw, value)
    try:
        return tomli_w.dumps(_toml_safe(value) if isinstance(value, dict) else {"x": _toml_safe(value)}).encode()
    except (TypeError, ValueError, RecursionError):
        return draw(st.sampled_from(seeds))


def _toml_safe(value: Any) -> Any:
    """TOML has no null and no bytes; keys are text."""
    if isinstance(value, dict):
        return {str(k): _toml_safe(v) for k, v in value.items() if v is not None}
    if isinstance(value, list):
        return [_toml_safe(v) for v in value if v is not None]
    return value.decode("latin-1") if isinstance(value, bytes) else value


@st.composite
def mutated_bytes(draw: st.DrawFn, seeds: list[bytes]) -> bytes:
    """A valid input with bytes flipped, cut, inserted or a stretch repeated."""
    data = bytearray(draw(st.sampled_from(seeds)))
    for _ in range(draw(st.integers(1, 4))):
        kind = draw(st.sampled_from(["flip", "cut", "insert", "repeat"]))
        at = draw(st.integers(0, max(len(data) - 1, 0)))
        if kind == "flip" and data:
            data[at] = draw(st.integers(0, 255))
        elif kind == "cut":
            del data[at:at + draw(st.integers(1, 64))]
        elif kind == "insert":
            data[at:at] = draw(st.binary(min_size=1, max_size=16))
        elif kind == "repeat":
            stretch = bytes(data[at:at + draw(st.integers(1, 32))])
            data[at:at] = stretch * draw(st.integers(1, 64))
    return bytes(data)


# -- targets ----------------------------------------------------------------------------------------

@dataclass
class Target:
    name: str
    run: Callable[[bytes], Any]
    errors: tuple[type[BaseException], ...]
    seeds: Callable[[], list[bytes]]
    structure: str = "msgpack"  # how mutated inputs are made: "msgpack" or "bytes"
    check: Callable[[], None] | None = None  # after each case: nothing accepted before was lost
    _seeds: list[bytes] | None = field(default=None, repr=False)

    def valid_inputs(self) -> list[bytes]:
        if self._seeds is None:
            self._seeds = self.seeds()
        return self._seeds

    def raw(self) -> st.SearchStrategy[bytes]:
        return st.binary(max_size=4096) | st.builds(lambda s: s[: len(s) // 2], st.sampled_from(self.valid_inputs()))

    def structured(self) -> st.SearchStrategy[bytes]:
        seeds = self.valid_inputs()
        mutated = {"msgpack": mutated_msgpack, "json": mutated_json, "toml": mutated_toml}.get(
            self.structure, lambda _: st.nothing())(seeds)
        return st.sampled_from(seeds) | mutated | mutated_bytes(seeds)


@dataclass
class Tally:
    """What a run of one target met: cases, refusals by distinct message, crashes."""

    cases: int = 0
    values: int = 0
    errors: Counter = field(default_factory=Counter)
    crashes: list[str] = field(default_factory=list)
    slowest: float = 0.0

    def record(self, target: Target, data: bytes, *, raise_crashes: bool = False) -> None:
        """Run one case and count its ending; with ``raise_crashes`` (the suite) a crash
        raises, so Hypothesis shrinks it to a minimal input."""
        self.cases += 1
        crashes = len(self.crashes)
        started = time.perf_counter()
        try:
            result = target.run(data)
            self.values += 1
            # Refusals some targets return as values: damaged records, a validator's verdict.
            for item in result if isinstance(result, list) else [result]:
                if isinstance(item, Exception):
                    self._refused(item)
                elif isinstance(item, enum.Enum):
                    self.errors[f"validation: {item.name}"] += 1
        except target.errors as error:
            self._refused(error)
        except Exception as error:  # a crash is what this harness exists to find and report
            self.crashes.append(f"{type(error).__name__}: {str(error)[:200]} on {data[:64]!r}")
        elapsed = time.perf_counter() - started
        self.slowest = max(self.slowest, elapsed)
        if elapsed > CASE_SECONDS:
            self.crashes.append(f"slow: {elapsed:.2f} s on {len(data)} bytes")
        if target.check is not None:
            try:
                target.check()
            except AssertionError as error:
                self.crashes.append(f"lost: {error}")
        if raise_crashes and len(self.crashes) > crashes:
            raise AssertionError(f"{target.name}: {self.crashes[-1]}")

    def _refused(self, error: Exception) -> None:
        # Distinct errors: the message with its numbers and quoted values masked.
        self.errors[re.sub(r"\d+|'[^']*'|\"[^\"]*\"", "#", str(error))[:120]] += 1


def _vrf_claims() -> list[bytes]:
    claims = []
    for i in range(3):
        secret = hashlib.sha256(b"fuzz vrf key %d" % i).digest()
        alpha = b"vrl/committee/v1\x00" + i.to_bytes(8, "big") + hashlib.sha256(b"root %d" % i).digest()
        claims.append(vrf.public_key(secret) + vrf.prove(secret, alpha) + alpha)
    return claims


def message_targets() -> list[Target]:
    def request(data: bytes) -> BackfillRequest:
        return BackfillRequest.from_bytes(data)

    return [
        Target("record", Rollout.from_bytes, (RecordError,), lambda: [rollout().to_bytes(), rollout(
            completion_tokens=(1,) * 64, behaviour_logprobs=(-0.1,) * 64, finish_reason="length").to_bytes()]),
        Target("group", decode_group, (MessageError,), lambda: [group(2).to_bytes(), group(4).to_bytes()]),
        Target("verdict", SignedVerdict.from_bytes, (MessageError,),
               lambda: [verdict(o).to_bytes() for o in ("pass", "soft_fail", "skipped")]
               + [verdict(reasons=("race_losses",), race_tokens=640, races_lost=9).to_bytes()]),
        Target("fraud report", SignedVerdict.from_bytes, (MessageError,),  # a hard_fail verdict (network.md §5.1)
               lambda: [verdict("hard_fail").to_bytes(), verdict("hard_fail", planted=True).to_bytes()]),
        Target("policy", PolicyAnnouncement.from_bytes, (MessageError,), lambda: [
            policy(0).to_bytes(), policy(2**64 - 1).to_bytes(),
            dataclasses.replace(policy(3), delta=b"\x08" * 32, delta_size=99, delta_parent=b"\x09" * 32
                                ).signed(TRAINER).to_bytes()]),
        # specs/committee.md §3: a round of two workers' groups and two weights, and one of a
        # single group and no weight; and the lists behind the first, as the trainer stores them.
        Target("round manifest", RoundManifest.from_bytes, (MessageError,), lambda: [
            RoundManifest.of(TRAINER.node_id, committee.PagedManifest(lists_example()).header).signed(
                TRAINER).to_bytes(),
            RoundManifest(TRAINER.node_id, 0, 1, 1, b"\x01" * 32, 0, 0, b"\x02" * 32, 1, b"\x03" * 32).signed(
                TRAINER).to_bytes()]),
        Target("manifest lists", ManifestLists.from_bytes, (MessageError,),
               lambda: [ManifestLists.of(lists_example()).to_bytes(),  # seat rule 2 (version 2) and 1 (version 1)
                        ManifestLists.of(dataclasses.replace(lists_example(), seat_rule=1)).to_bytes()]),
        # specs/committee.md §3.5: by position and by key, and an answer with its multiproof.
        Target("entries request", EntriesRequest.from_bytes, (MessageError,), lambda: [
            EntriesRequest(7, committee.List.GROUPS, (0, 2), ()).to_bytes(),
            EntriesRequest(7, committee.List.WEIGHTS, (), (KEY.node_id,)).to_bytes()]),
        Target("entries", EntriesAnswer.from_bytes, (MessageError,), lambda: [
            EntriesAnswer.of(committee.PagedManifest(lists_example()).answer(committee.List.GROUPS, (0, 2))
                             ).to_bytes()]),
        Target("step verdict", StepVerdict.from_bytes, (MessageError,),
               lambda: [step_verdict("fraud").to_bytes(), step_verdict("pass").to_bytes()]),
        Target("step config", StepConfig.from_bytes, (StepError,), lambda: [step_config_file()]),
        Target("optimizer state", load_optimizer_file, (StepError,), lambda: [optimizer_file()], structure="bytes"),
        Target("backfill request", request, (MessageError,),
               lambda: [BackfillRequest(0, 0).to_bytes(), BackfillRequest(2**64 - 1, 7).to_bytes(),
                        BackfillRequest(3, 0, (0,) * 6).to_bytes(),  # with a cursor (specs/network.md §6)
                        BackfillRequest(3, 9, (2**64 - 1, 1, 0, 2**63 - 1, 5, 7)).to_bytes(),
                        # naming what the client holds: a salt and short ids (§6 ``have``)
                        BackfillRequest(3, 0, (5, 1, 2, 3, 4, 5), bytes(range(8)) + b"\x07" * 24).to_bytes()]),
        Target("backfill page", lambda data: BackfillPage.from_bytes(data, after=0), (MessageError,),
               lambda: [BackfillPage((verdict().to_bytes(), group().to_bytes()), 5).to_bytes(),
                        BackfillPage((), None).to_bytes()]),
        # A page answering a cursor: it must carry one that does not go back (same generation).
        Target("backfill page by cursor", lambda data: BackfillPage.from_bytes(data, 0, (9, 1, 2, 3, 4, 5)),
               (MessageError,), lambda: [
                   BackfillPage((verdict().to_bytes(),), 1, (9, 1, 2, 7, 4, 5)).to_bytes(),
                   BackfillPage((), None, (2**64 - 1, 0, 0, 0, 0, 0)).to_bytes()]),
        Target("sampling request", SamplingRequest.from_bytes, (MessageError,),
               lambda: [SamplingRequest(bytes(32), bytes([7]) * 32, 4).to_bytes(),
                        SamplingRequest(bytes([1]) * 32, bytes(32), 64).to_bytes()]),
        Target("sampling answer", openings_from_bytes, (SamplingProofError,), _sampling_answers),
        # specs/vrf.md: public key (32 bytes) || pi (80) || alpha (the rest), as a committee claim carries them.
        Target("vrf proof", lambda data: vrf.verify(data[:32], data[32:112], data[112:]), (vrf.VrfError,),
               _vrf_claims, structure="bytes"),
        Target("weights delta", lambda data: deltas.rebuild(DELTA_PARENT, data), (DeltaError,),
               lambda: [deltas.encode(DELTA_PARENT, _delta_target(seed)) for seed in (0, 1)], structure="bytes"),
    ]


def _delta_weights(seed: int) -> bytes:
    """A small weights file (float32 and bfloat16 tensors) for the weights delta target."""
    import torch
    from safetensors.torch import save

    generator = torch.Generator().manual_seed(seed)
    return save({"a": torch.randn(64, generator=generator),
                 "b": torch.randn(3, 5, generator=generator).to(torch.bfloat16)})


def _delta_target(seed: int) -> bytes:
    """The parent's tensors, a few of them changed (as a GRPO step changes a bfloat16 file)."""
    import torch
    from safetensors.torch import load, save

    tensors = load(DELTA_PARENT)
    tensors["a"] = tensors["a"] + torch.randn(64, generator=torch.Generator().manual_seed(seed)) * 1e-6
    return save(tensors)


DELTA_PARENT = _delta_weights(0)


def _sampling_answers() -> list[bytes]:
    """Answers of the shape a producer sends (specs/zk.md §10): an empty one and one opening
    (its proof bytes are not a proof: the decoder does not verify, it decodes)."""
    from proofs import zk

    attachment = zk.Attachment("lm-logits/64x256/v1", bytes([1]) * 32, bytes([2]) * 32, bytes([3]) * 32,
                               bytes([4]) * 32, tuple(zk.felt(v) for v in range(-2, 318)), bytes(range(256)) * 12)
    opening = Opening(bytes([5]) * 32, 3, bytes(256), attachment)
    return [openings_bytes(bytes(32), []), openings_bytes(bytes([9]) * 32, [opening])]


def file_targets() -> list[Target]:
    """What the verifier CLI and the trainer read from disk."""
    def read_all(data: bytes) -> list:
        return list(records_from_bytes(data))  # damaged records come back as RecordError values

    def task_line(data: bytes):
        return task_from_line(data, default_id="line-1")

    return [
        Target("rollout file", read_all, (RolloutFileError,), lambda: [
            FILE_MAGIC + frame(rollout(0)) + frame(rollout(1)), FILE_MAGIC + b"VRLR" * 64, FILE_MAGIC],
               structure="bytes"),
        Target("node TOML", lambda data: NodeConfig.from_toml_bytes(data, "node.toml"), (ConfigError,), lambda: [
            tomli_w.dumps({"data_dir": "d", "trainer": "ab" * 32}).encode(),
            tomli_w.dumps({"data_dir": "/tmp/n", "trainer": "cd" * 32, "roles": ["trainer", "verifier"],
                           "listen": "/ip4/127.0.0.1/tcp/29000", "work": {"group_size": 8, "temperature": 0.7},
                           "bootstrap": [
                               "/ip4/127.0.0.1/tcp/29001/p2p/12D3KooWD3eckifWpRn9wQpMG9R9hX3sD158z7EqHWmweQAJU5SA"],
                           "metrics_port": 30001}).encode(),
            tomli_w.dumps({"data_dir": "d", "trainer": "ab" * 32, "work": {"model": "micro"},
                           "zk": {"hidden_states": True, "sampling_positions": 2, "proof_timeout": 240.0,
                                  "max_positions": 8, "dev_srs": True}}).encode()], structure="toml"),
        Target("checkpoint manifest", lambda data: parse_manifest(data, "MANIFEST.json"), (CheckpointError,),
               lambda: [json.dumps({"step": 12, "files": {n: "0" * 64 for n in (
                   "model.safetensors", "optimizer.safetensors", "state.json")}}).encode()], structure="json"),
        Target("task line", task_line, (TaskFileError,), lambda: [
            b'{"question": "Tom has 3 apples and buys 4. How many?", "answer": "He has 7.\\n#### 7"}',
            b'{"id": "t1", "prompt": "2+3=", "answer": "5"}', b'{"id": "t2", "prompt": "x", "answer": "\\frac{1}{2}"}'],
               structure="json"),
    ]


class NodeUnderFire:
    """A real node (loopback transport, tiny model) whose gossip validator, message handler
    and backfill server take the fuzz cases; what it accepted must stay stored and counted."""

    def __init__(self, directory: Path) -> None:
        from p2p.loopback import LoopbackNetwork
        from vrl.node import protocol as P
        from vrl.node.config import NodeConfig
        from vrl.node.daemon import Node

        worker = NodeKey.from_seed(hashlib.sha256(b"vrl fuzz worker").digest())
        config = NodeConfig(data_dir=str(directory), trainer=TRAINER.node_id.hex(), transport="loopback",
                            work={"model": "tiny", "task": "arithmetic:digits=1", "group_size": 2, "max_new_tokens": 4},
                            # Tickets: a verdict is stored as it arrives. Under committees one
                            # waits for its round's manifest (specs/committee.md §4 step 1), and
                            # this node's check is that what it accepted stays stored.
                            protocol={"groups_per_round": 1, "verification": "tickets"})
        self.loop = asyncio.new_event_loop()
        self.node = Node(config, LoopbackNetwork().transport(worker.private_seed()), worker)
        self.node.protocol.handle(P.PolicyAnnounced(policy(0)))
        self.accepted = {"policies": 0, "groups": 0, "verdicts": 0}
        self.P = P
        for data in (policy(0).to_bytes(), group().to_bytes(), verdict("pass").to_bytes()):
            self.gossip(self.topic(data), data)
        assert self.node.store.counts()["groups"] == 1 and self.node.store.counts()["verdicts"] == 1
        self.kept = {k: v for k, v in self.node.store.counts().items() if k in self.accepted}

    @staticmethod
    def topic(data: bytes) -> str:
        from vrl.node.messages import TOPIC_GROUPS, TOPIC_POLICIES, TOPIC_VERDICTS, topic_of

        return topic_of(data) or (TOPIC_GROUPS, TOPIC_VERDICTS, TOPIC_POLICIES)[len(data) % 3]

    def gossip(self, topic: str, data: bytes):
        from p2p.transport import Message, Validation, message_id

        message = Message(topic, data, b"\x09" * 32, message_id(topic, data))
        validation = self.node.validate(message)
        # What backfill asks of a message it did not store (specs/network.md §6): a version or
        # None, never an exception, whatever the bytes.
        waits = self.node.validate.waits(message)
        assert waits is None or isinstance(waits, int)
        if validation is Validation.ACCEPT:
            self.loop.run_until_complete(self._then_settle(self.node._on_message(message)))
        return validation

    async def _then_settle(self, handling) -> None:
        """Handle, then cancel what the handling spawned (a weight fetch no peer can serve)."""
        await handling
        for task in list(self.node._tasks):
            task.cancel()
        await asyncio.gather(*self.node._tasks, return_exceptions=True)

    def serve_backfill(self, data: bytes) -> bytes:
        return self.loop.run_until_complete(self.node.catchup.serve(b"\x09" * 32, data))

    def nothing_lost(self) -> None:
        counts = self.node.store.counts()
        for table, before in self.kept.items():
            assert counts[table] >= before, f"{table}: {counts[table]} stored, {before} before"
        self.kept = {k: v for k, v in counts.items() if k in self.accepted}
        assert self.node.protocol.waiting_verdicts <= self.P.MAX_PENDING_VERDICTS

    def close(self) -> None:
        self.node.store.close()
        self.loop.close()


def node_targets(node: NodeUnderFire) -> list[Target]:
    def seeds() -> list[bytes]:
        return [policy(0).to_bytes(), policy(1).to_bytes(), group(2).to_bytes(), verdict("pass").to_bytes(),
                verdict("hard_fail").to_bytes(), verdict("skipped", rate=0.0).to_bytes(),
                step_verdict("fraud").to_bytes()]

    return [
        Target("gossip handler", lambda data: node.gossip(node.topic(data), data), (), seeds, check=node.nothing_lost),
        Target("backfill handler", node.serve_backfill, (MessageError,),
               lambda: [BackfillRequest(0, 0).to_bytes(), BackfillRequest(2**64 - 1, 2**64 - 1).to_bytes(),
                        BackfillRequest(0, 0, (0,) * 6, b"\x01" * 8 + b"\x02" * 8 * 4096).to_bytes()],
               check=node.nothing_lost),
    ]


NODE_TARGETS = ("gossip handler", "backfill handler")


def all_targets(node: NodeUnderFire | None = None) -> list[Target]:
    """Every target; the node targets only when a node is given (they need a model)."""
    targets = message_targets() + file_targets()
    if node is not None:
        targets += node_targets(node)
    return targets



def store_with_column_set(store: Path, directory: Path, table: str, row: int, column: int,
                          payload: Any) -> Path | None:
    """A copy of ``store`` with one hostile value in one cell (the ``column``-th column, modulo
    the table's width, of its ``row``-th row), for the audit's hostile-store properties; None
    where SQLite itself refuses the value."""
    target = directory / "node.sqlite"
    shutil.copy(store, target)
    with sqlite3.connect(target) as db:
        columns = [info[1] for info in db.execute(f"PRAGMA table_info({table})")]
        name = columns[column % len(columns)]
        try:
            db.execute(f"UPDATE {table} SET {name} = ? WHERE rowid = (SELECT rowid FROM {table} ORDER BY rowid "
                       f"LIMIT 1 OFFSET ?)", (payload, row))
        except sqlite3.IntegrityError:
            return None
    return target
