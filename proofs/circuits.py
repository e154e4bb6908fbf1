"""The zk circuits (specs/zk.md §3): each one's graph, its inputs and the public instances a
verifier derives for it. :data:`CIRCUITS` is every circuit a verifier knows, by id.

answer-match/v1
    Proves ``correct = [answer == reference]`` where the answer is public and the reference is
    known only by its salted commitment. Both inputs are ``hashed/public``: the instances are
    ``Poseidon(answer codes)``, which the verifier recomputes from the public answer,
    ``Poseidon(reference codes || salt)``, the commitment published with the task set, and
    ``correct`` (1 or 0). The codes are a length and the UTF-8 bytes of the normalized answer
    (the caller normalizes; vrl/tasks/answers.py ``answer_form``), zero-padded to ANSWER_BYTES.

lm-logits/64x256/v1
    Proves ``logits = W h`` for one position of a policy with hidden size 64 and vocabulary 256
    (the ``micro`` preset): ``h``, the LM head's input, is public at scale HIDDEN_SCALE; ``W``
    is polycommit, so one setup serves every policy version and the verifier swaps in the
    commitment of the weights it expects; the logits are public at the same scale. The
    verifier runs the seeded race and the log-softmax on them itself, in float64.
"""

from __future__ import annotations

import secrets
from collections.abc import Iterable, Sequence
from typing import TYPE_CHECKING

import numpy as np
import numpy.typing as npt

from proofs.zk import Circuit, ZkError, felt, felt_int, poseidon

if TYPE_CHECKING:
    import torch  # imported where used: only zk work pays for it

#: Bytes of a normalized answer the circuit holds: GSM8K and MATH numeric answers in canonical
#: form ("n:" and a reduced fraction) fit in 32 with room; a longer answer cannot be proven.
ANSWER_BYTES = 32
ANSWER_CODES = ANSWER_BYTES + 1  # the length first, so "ab" and "ab\0" differ
#: The salt: 9 values of 15 bits, 135 bits. Poseidon commitments of low-entropy data can be
#: brute-forced (ezkl's docs/advanced_security/public_commitments.md), and an answer is low
#: entropy; 15 bits keeps each value inside ezkl's default lookup range (+-2^15), checked on inputs.
SALT_VALUES = 9
SALT_BITS = 15
SALT_BYTES = 2 * SALT_VALUES


def answer_codes(form: bytes) -> list[int]:
    """The circuit's encoding of a normalized answer: its length, then its bytes, zero-padded."""
    if not isinstance(form, bytes) or len(form) > ANSWER_BYTES:
        raise ZkError(f"a normalized answer of {len(form) if isinstance(form, bytes) else '?'} bytes: "
                      f"answer-match/v1 holds at most {ANSWER_BYTES}")
    return [len(form), *form, *[0] * (ANSWER_BYTES - len(form))]


def new_salt() -> bytes:
    """A fresh salt: SALT_VALUES big-endian u16, each below 2^SALT_BITS."""
    return b"".join(secrets.randbelow(1 << SALT_BITS).to_bytes(2, "big") for _ in range(SALT_VALUES))


def salt_values(salt: bytes) -> list[int]:
    if not isinstance(salt, bytes) or len(salt) != SALT_BYTES:
        raise ZkError(f"a salt must be {SALT_BYTES} bytes")
    values = [int.from_bytes(salt[i:i + 2], "big") for i in range(0, SALT_BYTES, 2)]
    if any(v >= 1 << SALT_BITS for v in values):
        raise ZkError(f"a salt value must be below 2^{SALT_BITS}")
    return values


def reference_commitment(form: bytes, salt: bytes) -> bytes:
    """What a task set publishes for a private reference answer: Poseidon(codes || salt)."""
    return poseidon(answer_codes(form) + salt_values(salt))


def answer_match_inputs(answer: bytes, reference: bytes, salt: bytes) -> list[list[int]]:
    """The prover's witness inputs: the public answer, the private reference and its salt."""
    return [answer_codes(answer), answer_codes(reference) + salt_values(salt)]


def answer_match_instances(answer: bytes, commitment: bytes, correct: bool) -> tuple[bytes, ...]:
    """The public instances a verifier expects, from what it knows: the answer it extracted
    itself, the task's published commitment, and the correctness claimed."""
    if not isinstance(commitment, bytes) or len(commitment) != 32:
        raise ZkError("a reference commitment must be 32 bytes")
    return poseidon(answer_codes(answer)), commitment, felt(int(bool(correct)))


def _answer_match_module() -> torch.nn.Module:
    import torch

    class AnswerMatch(torch.nn.Module):
        """correct = relu(1 - sum |answer - reference[:codes]|): 1 exactly when every code
        agrees, since the codes are integers (scale 0)."""

        def forward(self, answer: torch.Tensor, reference: torch.Tensor) -> torch.Tensor:
            distance = (answer - reference[:, :ANSWER_CODES]).abs().sum(dim=-1, keepdim=True)
            return torch.relu(1 - distance)

    return AnswerMatch()


def _answer_match_example() -> tuple[torch.Tensor, ...]:
    import torch

    return torch.zeros(1, ANSWER_CODES), torch.zeros(1, ANSWER_CODES + SALT_VALUES)


ANSWER_MATCH = Circuit("answer-match/v1", logrows=15, module=_answer_match_module, example=_answer_match_example,
                       settings_hash=bytes.fromhex("8306ca7e51ebb8d2a67afcf7b394fd64b53b70ab334c3102ea377f2d52fd053f"),
                       proof_bytes=3840)

# -- lm-logits: one position's logits from a committed hidden state ----------------------------

#: Fixed-point scale of hidden states, weights and logits: values are multiples of 2^-13.
#: Scale 13 proved the logits of a 64x256 head to within 1e-3 at k=15 (shared/research/ezkl.md
#: §2, d-logits; 8e-4 measured here, bench/results/zk.json), far below a sampled token's margin.
HIDDEN_SCALE = 13
#: The largest quantized value a hidden state may hold: |h| < 2^20 (a final-norm output is
#: within tens): far inside the field, and what the verifier's range checks assume.
MAX_HIDDEN_MAGNITUDE = 1 << 33


def quantize_hidden(rows: npt.ArrayLike) -> npt.NDArray[np.int64]:
    """Hidden-state rows (float32, as captured) as the circuit's integers: ``rint(h * 2^13)``,
    ties to even, exact in float64 (specs/zk.md §10). Shape (rows, hidden), int64."""
    values = np.asarray(rows, dtype=np.float32).astype(np.float64) * float(1 << HIDDEN_SCALE)
    if not np.isfinite(values).all() or np.abs(values).max(initial=0.0) >= MAX_HIDDEN_MAGNITUDE:
        raise ZkError(f"a hidden state outside +-2^{MAX_HIDDEN_MAGNITUDE.bit_length() - 1 - HIDDEN_SCALE}")
    return np.rint(values).astype(np.int64)


def hidden_hash(quantized: Iterable[int]) -> bytes:
    """Poseidon of one quantized hidden state, as signed field elements: what a record commits
    per sampled token before any position is challenged."""
    return poseidon([int(v) for v in quantized])


def lm_logits_circuit(hidden: int, vocab: int) -> Circuit:
    """The LM-head circuit of one shape (``lm-logits/{hidden}x{vocab}/v1``)."""

    def module() -> torch.nn.Module:
        import torch

        head = torch.nn.Linear(hidden, vocab, bias=False)
        torch.nn.init.zeros_(head.weight)  # the keys do not depend on the weights (polycommit)
        return head

    def example() -> tuple[torch.Tensor, ...]:
        import torch

        return (torch.zeros(1, hidden),)

    return Circuit(f"lm-logits/{hidden}x{vocab}/v1", logrows=15, module=module, example=example,
                   input_visibility="public", param_visibility="polycommit", scale=HIDDEN_SCALE,
                   settings_hash=bytes.fromhex(_PINNED.get((hidden, vocab), "")), proof_bytes=3200 if (hidden, vocab)
                   in _PINNED else 0)


#: Settings hashes measured with ezkl 23.0.5 and torch 2.13.0 (specs/vectors/zk.json).
_PINNED = {(64, 256): "0c2ce1a69af1e4e784a1fb0aebfbe19b379ab9972d2f618eedd86d80112cfe9c"}


def lm_head_module(weight: torch.Tensor) -> torch.nn.Module:
    """The circuit's graph with a policy's LM-head weights (vocab x hidden, float32)."""
    import torch

    vocab, hidden = weight.shape
    head = torch.nn.Linear(hidden, vocab, bias=False)
    with torch.no_grad():
        head.weight.copy_(weight.detach().to(torch.float32).cpu())
    return head


def lm_logits_split(circuit: Circuit, instances: Sequence[bytes]) -> tuple[list[int], list[int]]:
    """An lm-logits attachment's instances as (quantized hidden state, quantized logits); a
    ZkError when their count or values do not fit the circuit."""
    hidden = int(circuit.example()[0].shape[-1])
    vocab = int(circuit.id.split("/")[1].split("x")[1])
    if len(instances) != hidden + vocab:
        raise ZkError(f"{circuit.id}: {len(instances)} instances, not {hidden + vocab}")
    values = [felt_int(i) for i in instances]
    return values[:hidden], values[hidden:]


LM_LOGITS_MICRO = lm_logits_circuit(64, 256)

#: Every circuit a verifier knows, by id.
CIRCUITS: dict[str, Circuit] = {c.id: c for c in (ANSWER_MATCH, LM_LOGITS_MICRO)}

