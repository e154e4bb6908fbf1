"""Sampling proofs at challenged positions (specs/zk.md §10): that a sampled token won its seeded
race from the hidden state the record committed, under the policy's LM-head weights.

For a policy small enough (the ``micro`` preset: hidden size 64, vocabulary 256) a record
commits, per sampled token, ``Poseidon(quantize(h))`` of the LM head's input ``h``
(``hidden_hashes``). After the record exists a verifier picks positions (:func:`challenged`,
from a challenge the producer could not know), and the producer answers each with an
:class:`Opening`: the float32 row it hashed and a proof that ``logits = W q(h)``, with ``W``
bound by a commitment to the policy's weights. The verifier then checks:

1. the row hashes to the record's hash at that position (it is what was committed before the
   challenge), and the record's activation commitment opens at the row to its own bf16 bits;
2. the proof, against the verifier's own weight commitment;
3. the proven logits against its own prefill's, within its drift: the activation commitment
   holds three values of a row, so only a prefill binds the other 61 to the model (a row
   crafted to keep those three was accepted before this check, found in review);
4. the race: the claimed token wins ``z / T + g`` over the proven logits with the public PRF
   noise, and its logprob is ``log softmax(z / T)`` in float64, each within the circuit's
   fixed-point error (:data:`LOGIT_TOLERANCE`), not re-execution's drift.

A check costs about 25 ms a position, the prefill included (bench/results/zk.json). The
producer keeps its rows in a witness file (:func:`write_witness`): a fresh prefill does not
reproduce a decode's rows bit for bit.
"""

from __future__ import annotations

import enum
import hashlib
import math
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from pathlib import Path

import msgpack
import numpy as np
import torch

from proofs import commitment, sampler, zk
from proofs.circuits import CIRCUITS, HIDDEN_SCALE, hidden_hash, lm_head_module, lm_logits_split, quantize_hidden
from proofs.errors import MalformedCommitment, UndefinedRace
from proofs.sampling_params import SamplingParams
from vrl.errors import VrlError
from vrl.rollouts.files import write_bytes_atomic
from vrl.rollouts.model import Model
from vrl.rollouts.record import HIDDEN_HASH_BYTES, Rollout
from vrl.zk.rewards import ZkFileError, record_subject, regular_file_bytes

SAMPLING_FORMAT = "vrl/sampling/v1"
WITNESS_FORMAT = "vrl/hidden/v1"
CHALLENGE_DOMAIN = b"vrl/sampling-challenge/v1\x00"
SUBJECT_DOMAIN = b"vrl/sampling-proof/v1\x00"
#: A challenge: 32 bytes the producer cannot know before its records exist (an audit ticket,
#: a later beacon, or a verifier's random bytes).
CHALLENGE_BYTES = 32
#: Positions one record may be challenged at: proving costs seconds per position (bench/zk.py),
#: so a challenge spot-checks, and 64 bounds what a verifier asks of a producer.
MAX_POSITIONS = 64
#: Raw-logit distance between a proven logit and the float32 logit the producer sampled from:
#: the circuit rounds h and W to multiples of 2^-13 (HIDDEN_SCALE), which moves a logit by at
#: most (|h|_1 + |w|_1) 2^-14 plus a rescaling's 2^-14. The worst over 265 of base-micro's
#: sampled positions is 1.26e-3 (bench/zk.py, bench/results/zk.json "logit_error_max"); 4e-3
#: leaves three times that. A race lost by more, or a logprob off by more than 2 tau / T (log
#: softmax is 1-Lipschitz in the max norm), is not rounding.
LOGIT_TOLERANCE = 4e-3
#: A logprob is stored as float32 in the record (specs/record.md §2): its rounding, on top.
LOGPROB_STORAGE = 1e-5
#: The largest witness or sampling-proof file read: 256 bytes per token (micro's rows) or 14 KB
#: per opening; 2 GiB holds a rollout file's worth (MAX_COMPANION_BYTES is the same order).
MAX_FILE_BYTES = 1 << 31


class SamplingProofError(VrlError, ValueError):
    """A witness or sampling-proof file, a challenge or a model that cannot be used; the
    message names the file and, where it can, the entry."""


class Check(enum.StrEnum):
    """The outcome of one challenged position (specs/zk.md §10), in the order checked; the
    proof's own failures are proofs.zk.Reason codes."""

    OK = "ok"
    NOT_COMMITTED = "sampling_not_committed"  # the record commits no hidden states
    MISSING = "sampling_missing"  # a challenged position without an opening
    NOT_CHALLENGED = "sampling_not_challenged"  # an opening at a position nobody challenged
    UNSUPPORTED = "sampling_unsupported"  # sampled with a top-k or top-p mask: no proof covers it
    WRONG_HIDDEN = "sampling_wrong_hidden"  # the row does not hash to the record's hash
    UNCOMMITTED_ROW = "sampling_uncommitted_row"  # the activation commitment does not open at the row
    WRONG_LOGITS = "sampling_wrong_logits"  # the proven logits are not the verifier's own prefill's
    LOST_RACE = "sampling_lost_race"  # the claimed token loses its race on the proven logits
    WRONG_LOGPROB = "sampling_wrong_logprob"  # the record's logprob is not the proven one


# -- what a proof is about ------------------------------------------------------------------------

def circuit_for(model: Model) -> zk.Circuit:
    """The lm-logits circuit of ``model``'s LM head; a SamplingProofError naming the shape for
    a model no circuit covers (a head with a bias, or larger than the micro preset's)."""
    if model.dtype_name != "float32":
        raise SamplingProofError(f"{model.name}: sampling proofs need a float32 model, not {model.dtype_name} (the "
                                 "circuit's rounding bound, LOGIT_TOLERANCE, was measured in float32)")
    head = model.network.get_output_embeddings()
    if not isinstance(head, torch.nn.Linear) or head.bias is not None:
        raise SamplingProofError(f"{model.name}: sampling proofs need a plain linear LM head")
    vocab, hidden = head.weight.shape
    circuit = CIRCUITS.get(f"lm-logits/{hidden}x{vocab}/v1")
    if circuit is None:
        raise SamplingProofError(f"{model.name}: no sampling circuit for hidden size {hidden} and vocabulary {vocab} "
                                 "(there is one for the micro preset, 64 x 256: use --model base-micro)")
    return circuit


def head_module(model: Model) -> torch.nn.Module:
    return lm_head_module(torch.from_numpy(head_weight(model)))


def head_commitment(model: Model, srs: zk.Srs, workdir: Path) -> bytes:
    """The commitment to ``model``'s LM-head weights under ``srs``: what the trainer publishes
    once per policy version, and what a verifier holding the weights derives itself. Kept for
    the last few (model, SRS) pairs: a node checks many groups of one version."""
    key = (model.model_hash, srs.sha256, str(workdir))
    if key not in _COMMITMENTS:
        built = zk.build(circuit_for(model), workdir)
        _COMMITMENTS[key] = zk.params_commitment(built, zk.compiled_with(built, head_module(model)),
                                                 zk.keys(built, srs))
        while len(_COMMITMENTS) > _KEPT_COMMITMENTS:
            _COMMITMENTS.pop(next(iter(_COMMITMENTS)))
    return _COMMITMENTS[key]


#: A node holds at most max_staleness + 2 = 4 versions with the defaults (specs/network.md §2).
_KEPT_COMMITMENTS = 8
_COMMITMENTS: dict[tuple[bytes, bytes, str], bytes] = {}


def challenged(rollout: Rollout, challenge: bytes, count: int) -> tuple[int, ...]:
    """The positions a challenge picks in a record: ``min(count, n)`` distinct positions of its
    ``n`` tokens, drawn by SHA-256 in counter mode from the record and the challenge, sorted."""
    if not isinstance(challenge, bytes) or len(challenge) != CHALLENGE_BYTES:
        raise SamplingProofError(f"a challenge is {CHALLENGE_BYTES} bytes")
    if not isinstance(count, int) or not 1 <= count <= MAX_POSITIONS:
        raise SamplingProofError(f"--positions: 1 to {MAX_POSITIONS} per record")
    n = len(rollout.completion_tokens)
    picked: list[int] = []
    seed = CHALLENGE_DOMAIN + record_subject(rollout) + challenge
    counter = 0
    while len(picked) < min(count, n):
        word = int.from_bytes(hashlib.sha256(seed + counter.to_bytes(4, "big")).digest()[:8], "big")
        counter += 1
        if word >= (1 << 64) - (1 << 64) % n:  # rejection: every position equally likely
            continue
        if word % n not in picked:
            picked.append(word % n)
    return tuple(sorted(picked))


def subject(rollout: Rollout, position: int) -> bytes:
    """What an opening's proof names: the record (its digest) and the position."""
    return hashlib.sha256(SUBJECT_DOMAIN + record_subject(rollout) + position.to_bytes(4, "big")).digest()


def witness_path(rollout_file: Path | str) -> Path:
    """Where a rollout file's hidden states are kept: FILE.hidden."""
    return Path(f"{rollout_file}.hidden")


def openings_path(rollout_file: Path | str) -> Path:
    """Where a rollout file's sampling proofs are kept: FILE.sampling."""
    return Path(f"{rollout_file}.sampling")


# -- the producer's witness -----------------------------------------------------------------------

def write_witness(path: Path | str, rows: Sequence[tuple[Rollout, torch.Tensor]]) -> None:
    """The producer's rows (float32, one per sampled token) by record, written whole or not at
    all: without them it cannot answer a challenge, since a fresh prefill does not reproduce a
    decode's rows bit for bit."""
    entries = [[record_subject(rollout), int(r.shape[0]), int(r.shape[1]), r.to(torch.float32).numpy().tobytes()]
               for rollout, r in rows]
    write_bytes_atomic(Path(path), msgpack.packb([WITNESS_FORMAT, entries], use_bin_type=True))


def read_witness(path: Path | str) -> dict[bytes, np.ndarray]:
    """A witness file's rows by record digest; a SamplingProofError naming the entry otherwise."""
    path = Path(path)
    fields = _unpack(_read(path), path)
    if not (isinstance(fields, list) and len(fields) == 2 and fields[0] == WITNESS_FORMAT
            and isinstance(fields[1], list)):
        raise SamplingProofError(f"{path}: not a {WITNESS_FORMAT} file")
    rows: dict[bytes, np.ndarray] = {}
    for number, entry in enumerate(fields[1]):
        if not (isinstance(entry, list) and len(entry) == 4 and isinstance(entry[0], bytes) and len(entry[0]) == 32
                and all(isinstance(v, int) and not isinstance(v, bool) and 0 < v <= 1 << 20 for v in entry[1:3])
                and isinstance(entry[3], bytes) and len(entry[3]) == 4 * entry[1] * entry[2]):
            raise SamplingProofError(f"{path}: entry {number} is not [record digest, rows, width, float32 rows]")
        rows[entry[0]] = np.frombuffer(entry[3], dtype="<f4").reshape(entry[1], entry[2])
    return rows


# -- openings -------------------------------------------------------------------------------------

@dataclass(frozen=True, slots=True)
class Opening:
    """A producer's answer at one challenged position (specs/zk.md §10)."""

    record: bytes  # record_subject of the record
    position: int  # the completion token's index
    row: bytes  # the hidden state it committed: float32, little-endian
    attachment: zk.Attachment  # lm-logits proof: instances are q(row), then the logits

    def to_list(self) -> list[int | bytes]:
        return [self.record, self.position, self.row, self.attachment.to_bytes()]


def openings_bytes(challenge: bytes, openings: Sequence[Opening]) -> bytes:
    """A ``vrl/sampling/v1`` file's bytes: what ``vrl prove --kind sampling`` writes and a node
    answers a challenge with."""
    packed: bytes = msgpack.packb([SAMPLING_FORMAT, challenge, [o.to_list() for o in openings]], use_bin_type=True)
    return packed


def write_openings(path: Path | str, challenge: bytes, openings: Sequence[Opening]) -> None:
    write_bytes_atomic(Path(path), openings_bytes(challenge, openings))


def read_openings(path: Path | str) -> tuple[bytes, list[Opening]]:
    """A sampling-proof file's challenge and openings, decoded strictly and bounded."""
    path = Path(path)
    return openings_from_bytes(_read(path), path)


def _read(path: Path) -> bytes:
    try:
        return regular_file_bytes(path, MAX_FILE_BYTES)
    except ZkFileError as error:
        raise SamplingProofError(str(error)) from None


def openings_from_bytes(data: bytes, path: Path | str = "<bytes>") -> tuple[bytes, list[Opening]]:
    fields = _unpack(data, path)
    if not (isinstance(fields, list) and len(fields) == 3 and fields[0] == SAMPLING_FORMAT
            and isinstance(fields[1], bytes) and len(fields[1]) == CHALLENGE_BYTES and isinstance(fields[2], list)):
        raise SamplingProofError(f"{path}: not a {SAMPLING_FORMAT} file")
    openings = []
    for number, entry in enumerate(fields[2]):
        try:
            if not (isinstance(entry, list) and len(entry) == 4 and isinstance(entry[0], bytes) and len(entry[0]) == 32
                    and isinstance(entry[1], int) and not isinstance(entry[1], bool) and 0 <= entry[1] < 1 << 20
                    and isinstance(entry[2], bytes) and 0 < len(entry[2]) <= 4 << 16 and len(entry[2]) % 4 == 0
                    and isinstance(entry[3], bytes)):
                raise zk.MalformedAttachment("not [record digest, position, float32 row, attachment]")
            openings.append(Opening(entry[0], entry[1], entry[2], zk.Attachment.from_bytes(entry[3])))
        except zk.MalformedAttachment as error:
            raise SamplingProofError(f"{path}: opening {number}: {error}") from None
    return fields[1], openings


def _unpack(data: bytes, path: Path | str) -> object:
    try:
        return msgpack.unpackb(data, raw=False, strict_map_key=True, use_list=True, max_map_len=0, max_ext_len=0)
    except (ValueError, TypeError, msgpack.ExtraData, msgpack.FormatError, msgpack.StackError) as error:
        raise SamplingProofError(f"{path}: not msgpack ({error})") from None


# -- proving --------------------------------------------------------------------------------------

def prove_sampling(model: Model, rollouts: Sequence[Rollout], witness: dict[bytes, np.ndarray], challenge: bytes,
                   count: int, srs: zk.Srs, workdir: Path,
                   on_proof: Callable[[int], None] | None = None) -> list[Opening]:
    """Answer ``challenge`` for every record: open ``count`` positions of each with a proof."""
    circuit_for(model)  # the model's head has a circuit, and the model is float32
    return prove_with_head(head_weight(model), rollouts, witness, challenge, count, srs, workdir, on_proof)


def head_weight(model: Model) -> np.ndarray:
    """The LM head's weights (vocabulary x hidden, float32): all proving needs of the model."""
    weight: np.ndarray = model.network.get_output_embeddings().weight.detach().to(torch.float32).cpu().numpy()
    return weight


def prove_with_head(weight: np.ndarray, rollouts: Sequence[Rollout], witness: dict[bytes, np.ndarray],
                    challenge: bytes, count: int, srs: zk.Srs, workdir: Path,
                    on_proof: Callable[[int], None] | None = None) -> list[Opening]:
    """:func:`prove_sampling` from the head's weights alone, so that it can run in a process of
    its own: ezkl holds the GIL while it proves (2.8 s of a 3.2 s proof, measured here), which
    would stall a node's event loop, and its network with it."""
    vocab, hidden = weight.shape
    circuit = CIRCUITS.get(f"lm-logits/{hidden}x{vocab}/v1")
    if circuit is None:
        raise SamplingProofError(f"no sampling circuit for hidden size {hidden} and vocabulary {vocab}")
    module = lm_head_module(torch.from_numpy(np.ascontiguousarray(weight)))
    openings = []
    for rollout in rollouts:
        digest = record_subject(rollout)
        if not rollout.hidden_hashes:
            raise SamplingProofError(f"record {rollout.task_id}/{rollout.sample_index}: it commits no hidden states "
                                     "(generate with --hidden-states)")
        if not supported(rollout.sampling):
            raise SamplingProofError(f"record {rollout.task_id}/{rollout.sample_index}: sampled with a top-k or "
                                     "top-p mask, which sampling proofs do not cover")
        rows = witness.get(digest)
        if rows is None or rows.shape[0] != len(rollout.completion_tokens):
            raise SamplingProofError(f"record {rollout.task_id}/{rollout.sample_index}: not in the witness file")
        for position in challenged(rollout, challenge, count):
            row = np.ascontiguousarray(rows[position], dtype="<f4")
            quantized = quantize_hidden(row[None])[0]
            if hidden_hash(quantized) != _hash_at(rollout, position):
                raise SamplingProofError(f"record {rollout.task_id}/{rollout.sample_index}: the witness row at "
                                         f"{position} is not the one the record committed")
            attachment = zk.prove(circuit, [quantized.tolist()], subject(rollout, position), srs, workdir,
                                  params=module)
            openings.append(Opening(digest, position, row.tobytes(), attachment))
            if on_proof:
                on_proof(1)
    return openings


def prover_init() -> None:
    """What a node's prover process does first: it leaves SIGINT to its parent (a Ctrl-C in the
    terminal reaches the whole process group, and the node stops itself cleanly), and exits as
    soon as its parent is gone (a killed node would otherwise leave it proving, and holding
    its memory, forever: seen here)."""
    import multiprocessing
    import os
    import signal
    import threading

    signal.signal(signal.SIGINT, signal.SIG_IGN)
    parent = multiprocessing.parent_process()
    if parent is not None:
        def watch() -> None:
            parent.join()
            os._exit(0)

        threading.Thread(target=watch, daemon=True, name="vrl-parent-watch").start()


def answer_challenge(weight: np.ndarray, rollouts: Sequence[Rollout], witness_file: Path, challenge: bytes,
                     count: int, srs: zk.Srs, workdir: Path) -> bytes:
    """A producer's whole answer, as a node sends it: the ``vrl/sampling/v1`` bytes for
    ``rollouts`` from the rows in ``witness_file`` (a child process's job, specs/network.md §3.4)."""
    openings = prove_with_head(weight, rollouts, read_witness(witness_file), challenge, count, srs, workdir)
    return openings_bytes(challenge, openings)


def supported(sampling: SamplingParams) -> bool:
    """Whether sampling proofs cover records sampled so: temperature (or greedy) without a top-k
    or top-p mask. A mask's edge moves with the logits' rounding, and a proof's logits are
    rounded: the set of tokens raced could differ from the producer's (specs/zk.md §10)."""
    return not sampling.top_k and sampling.top_p >= 1.0


def _hash_at(rollout: Rollout, position: int) -> bytes:
    return rollout.hidden_hashes[position * HIDDEN_HASH_BYTES:(position + 1) * HIDDEN_HASH_BYTES]


# -- checking -------------------------------------------------------------------------------------

@dataclass(frozen=True, slots=True)
class PositionCheck:
    """One challenged (or opened) position of one record, and what its check found."""

    record: int  # index of the record in the caller's list
    position: int
    outcome: str  # a Check, or a proofs.zk.Reason code
    margin: float = math.nan  # by how much the claimed token lost its race (0: won), raw logits
    logprob_error: float = math.nan


def check_openings(rollouts: Sequence[Rollout], openings: Sequence[Opening], model: Model, srs: Sequence[zk.Srs],
                   workdir: Path, *, challenge: bytes | None = None, count: int = 0, allow_dev: bool = False,
                   drift: float | None = None) -> list[PositionCheck]:
    """Check every opening about one of ``rollouts`` and, given the ``challenge`` and ``count``
    the verifier issued, that every challenged position is answered and nothing else is.

    ``drift`` is how far (raw logits) the verifier's own prefill may honestly be from the
    producer's decode: its profile's race margin (vrl.rollouts.profiles), by default the
    model's own CPU profile. The proven logits must be within it, plus the circuit's
    rounding, of the verifier's own: the hash and the activation commitment bind the row the
    producer committed, but the commitment holds only three of its values, so only a prefill
    binds the rest to the model's forward pass."""
    circuit = circuit_for(model)
    if drift is None:
        from vrl.rollouts.profiles import profile_of

        drift = profile_of(model).tolerances.race_margin
    by_digest = {record_subject(r): i for i, r in enumerate(rollouts)}
    commitments = {s.sha256: head_commitment(model, s, workdir) for s in srs}
    wanted = {(i, p) for i, r in enumerate(rollouts) if challenge is not None
              for p in challenged(r, challenge, count)} if challenge is not None else set()
    answered: dict[tuple[int, int], Opening] = {}
    for opening in openings:
        index = by_digest.get(opening.record)
        if index is not None:  # about another file's record otherwise; and the first answer counts
            answered.setdefault((index, opening.position), opening)
    own = _own_logits(model, rollouts, {index for index, _ in answered})
    results = []
    for (index, position), opening in answered.items():
        rollout = rollouts[index]
        if not rollout.hidden_hashes:
            outcome = PositionCheck(index, position, Check.NOT_COMMITTED)
        elif challenge is not None and (index, position) not in wanted:
            outcome = PositionCheck(index, position, Check.NOT_CHALLENGED)
        elif not supported(rollout.sampling):
            outcome = PositionCheck(index, position, Check.UNSUPPORTED)
        else:
            outcome = _check_one(rollout, index, opening, circuit, commitments, srs, workdir, allow_dev,
                                 own[index], drift)
        results.append(outcome)
    results += [PositionCheck(i, p, Check.MISSING) for i, p in sorted(wanted - set(answered))]
    return sorted(results, key=lambda c: (c.record, c.position))


def _own_logits(model: Model, rollouts: Sequence[Rollout], indices: set[int]) -> dict[int, torch.Tensor]:
    """The verifier's own logits for the records opened: one prefill each (what stage 5 of
    re-execution computes; a few milliseconds a record on the micro preset)."""
    from vrl.rollouts.forward import prefill

    ordered = sorted(indices)
    passes = prefill(model, [(list(rollouts[i].prompt_tokens), list(rollouts[i].completion_tokens)) for i in ordered])
    return {i: p.logits.double() for i, p in zip(ordered, passes)}


def _check_one(rollout: Rollout, index: int, opening: Opening, circuit: zk.Circuit, commitments: dict[bytes, bytes],
               srs: Sequence[zk.Srs], workdir: Path, allow_dev: bool, own: torch.Tensor,
               drift: float) -> PositionCheck:
    position = opening.position
    n = len(rollout.completion_tokens)
    if opening.attachment.circuit != circuit.id:
        return PositionCheck(index, position, zk.Reason.UNKNOWN_CIRCUIT)
    try:
        hidden, _ = lm_logits_split(circuit, opening.attachment.instances)
    except zk.ZkError:
        return PositionCheck(index, position, zk.Reason.WRONG_INSTANCES)
    row = np.frombuffer(opening.row, dtype="<f4")
    try:
        quantized = quantize_hidden(row[None])[0] if position < n else None
    except zk.ZkError:  # not finite, or past the range a hidden state may take
        quantized = None
    if quantized is None or len(quantized) != len(hidden) or hidden_hash(quantized) != _hash_at(rollout, position):
        return PositionCheck(index, position, Check.WRONG_HIDDEN)
    try:
        opens = commitment.opens(rollout.commitment, n + 1, position, torch.from_numpy(row.copy()))
    except MalformedCommitment:
        opens = False
    if not opens:
        return PositionCheck(index, position, Check.UNCOMMITTED_ROW)
    attachment = opening.attachment
    expected = (*(zk.felt(int(v)) for v in quantized), *attachment.instances[len(quantized):])
    reason = zk.verify(attachment, {circuit.id: circuit}, subject=subject(rollout, position), instances=expected,
                       srs=srs, workdir=workdir, allow_dev=allow_dev,
                       params=commitments.get(attachment.srs_hash, b"\0" * 32))
    if reason is not zk.Reason.OK:
        return PositionCheck(index, position, reason)
    logits = lm_logits_split(circuit, attachment.instances)[1]
    z = torch.tensor(logits, dtype=torch.float64) / float(1 << HIDDEN_SCALE)
    gap = float((z - own[position]).abs().max())
    if gap > drift + LOGIT_TOLERANCE:
        return PositionCheck(index, position, Check.WRONG_LOGITS, margin=gap)
    return _race(rollout, index, position, z)


def _race(rollout: Rollout, index: int, position: int, logits: torch.Tensor) -> PositionCheck:
    """The claimed token's race on the proven logits, and its logprob (specs/zk.md §10)."""
    z = logits[None]
    token = rollout.completion_tokens[position]
    if token >= z.shape[1]:
        return PositionCheck(index, position, Check.LOST_RACE, margin=math.inf)
    try:
        replay = sampler.replay(z, torch.tensor([token]), [rollout.sample_seed], [position], rollout.sampling,
                                LOGIT_TOLERANCE)
    except UndefinedRace:
        return PositionCheck(index, position, Check.LOST_RACE, margin=math.inf)
    margin = float(replay.margins[0])
    if margin > LOGIT_TOLERANCE:
        return PositionCheck(index, position, Check.LOST_RACE, margin=margin)
    error = abs(float(replay.logprobs[0]) - rollout.behaviour_logprobs[position])
    bound = 0.0 if rollout.sampling.greedy else 2 * LOGIT_TOLERANCE / rollout.sampling.temperature
    if error > bound + LOGPROB_STORAGE:
        return PositionCheck(index, position, Check.WRONG_LOGPROB, margin=margin, logprob_error=error)
    return PositionCheck(index, position, Check.OK, margin=margin, logprob_error=error)
