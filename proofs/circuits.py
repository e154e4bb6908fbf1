"""The zk circuits (specs/zk.md §3): each one's graph, its inputs and the public instances a
verifier derives for it. :data:`CIRCUITS` is every circuit a verifier knows, by id.

answer-match/v1
    Proves ``correct = [answer == reference]`` where the answer is public and the reference is
    known only by its salted commitment. Both inputs are ``hashed/public``: the instances are
    ``Poseidon(answer codes)``, which the verifier recomputes from the public answer,
    ``Poseidon(reference codes || salt)``, the commitment published with the task set, and
    ``correct`` (1 or 0). The codes are a length and the UTF-8 bytes of the normalized answer
    (the caller normalizes; vrl/tasks/answers.py ``answer_form``), zero-padded to ANSWER_BYTES.
"""

from __future__ import annotations

import secrets
from proofs.zk import Circuit, ZkError, felt, poseidon

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


def _answer_match_module():
    import torch

    class AnswerMatch(torch.nn.Module):
        """correct = relu(1 - sum |answer - reference[:codes]|): 1 exactly when every code
        agrees, since the codes are integers (scale 0)."""

        def forward(self, answer, reference):
            distance = (answer - reference[:, :ANSWER_CODES]).abs().sum(dim=-1, keepdim=True)
            return torch.relu(1 - distance)

    return AnswerMatch()


def _answer_match_example():
    import torch

    return torch.zeros(1, ANSWER_CODES), torch.zeros(1, ANSWER_CODES + SALT_VALUES)


ANSWER_MATCH = Circuit("answer-match/v1", logrows=15, module=_answer_match_module, example=_answer_match_example,
                       settings_hash=bytes.fromhex("8306ca7e51ebb8d2a67afcf7b394fd64b53b70ab334c3102ea377f2d52fd053f"),
                       proof_bytes=3840)

#: Every circuit a verifier knows, by id.
CIRCUITS: dict[str, Circuit] = {c.id: c for c in (ANSWER_MATCH,)}

