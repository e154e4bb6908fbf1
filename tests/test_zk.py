"""zk proofs with ezkl for real (specs/zk.md): the answer-match circuit built, set up against a
dev SRS, proven and checked; every way an attachment can be wrong is a reason, never an
exception; and the attachment decoder takes any bytes."""

from __future__ import annotations

import dataclasses
from pathlib import Path

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from proofs import zk
from proofs.circuits import (
    ANSWER_MATCH,
    CIRCUITS,
    answer_codes,
    answer_match_inputs,
    answer_match_instances,
    new_salt,
    reference_commitment,
    salt_values,
)

RECORD, OTHER_RECORD = bytes([7]) * 32, bytes([8]) * 32


@dataclasses.dataclass(frozen=True)
class Proven:
    workdir: object
    srs: zk.Srs
    commitment: bytes
    right: zk.Attachment  # "n:42" against the reference "n:42"
    wrong: zk.Attachment  # "n:41" against it: correct = 0


@pytest.fixture(scope="module")
def proven(zk_workdir) -> Proven:
    """Two proofs under the session's dev SRS: every test below reuses them."""
    workdir = zk_workdir
    srs = zk.dev_srs(workdir, ANSWER_MATCH.logrows)
    salt = new_salt()
    commitment = reference_commitment(b"n:42", salt)
    right = zk.prove(ANSWER_MATCH, answer_match_inputs(b"n:42", b"n:42", salt), RECORD, srs, workdir)
    wrong = zk.prove(ANSWER_MATCH, answer_match_inputs(b"n:41", b"n:42", salt), RECORD, srs, workdir)
    return Proven(workdir, srs, commitment, right, wrong)


def check(proven: Proven, attachment: zk.Attachment, *, answer: bytes = b"n:42", correct: bool = True,
          subject: bytes = RECORD, allow_dev: bool = True, srs=None) -> zk.Reason:
    """What a verifier does: the instances from what it knows, the circuit from its own build."""
    return zk.verify(attachment, CIRCUITS, subject=subject,
                     instances=answer_match_instances(answer, proven.commitment, correct),
                     srs=[proven.srs] if srs is None else srs, workdir=proven.workdir, allow_dev=allow_dev)


def test_a_proof_of_a_matching_answer_verifies_and_shows_nothing_of_the_reference(proven):
    assert check(proven, proven.right) is zk.Reason.OK
    assert proven.right.instances == answer_match_instances(b"n:42", proven.commitment, True)
    assert proven.right.instances[1] == proven.commitment  # the reference only as its commitment
    assert len(proven.right.proof) < zk.MAX_PROOF_BYTES


def test_a_wrong_answer_proves_only_a_zero_reward(proven):
    assert proven.wrong.instances[2] == zk.felt(0)
    assert check(proven, proven.wrong, answer=b"n:41", correct=False) is zk.Reason.OK
    # Claiming a reward of 1 for it: the verifier's own instances differ from the proof's ...
    assert check(proven, proven.wrong, answer=b"n:41", correct=True) is zk.Reason.WRONG_INSTANCES
    # ... and a proof whose instances were edited to say so does not verify.
    forged = dataclasses.replace(proven.wrong, instances=(*proven.wrong.instances[:2], zk.felt(1)))
    assert check(proven, forged, answer=b"n:41", correct=True) is zk.Reason.INVALID_PROOF


def test_every_way_an_attachment_is_wrong_is_its_own_reason(proven):
    right = proven.right
    cases = {
        "tampered proof": (dataclasses.replace(right, proof=right.proof[:99] + bytes([right.proof[99] ^ 1])
                                               + right.proof[100:]), {}, zk.Reason.INVALID_PROOF),
        "swapped public inputs": (right, {"answer": b"n:43"}, zk.Reason.WRONG_INSTANCES),
        "a proof for another record": (right, {"subject": OTHER_RECORD}, zk.Reason.WRONG_SUBJECT),
        "the wrong circuit": (dataclasses.replace(right, circuit="sampling/v9"), {}, zk.Reason.UNKNOWN_CIRCUIT),
        "other settings": (dataclasses.replace(right, settings_hash=bytes(32)), {}, zk.Reason.WRONG_SETTINGS),
        "a key of its own": (dataclasses.replace(right, vk_hash=bytes(32)), {}, zk.Reason.WRONG_KEY),
        "an SRS the verifier does not hold": (dataclasses.replace(right, srs_hash=bytes(32)), {}, zk.Reason.WRONG_SRS),
        "a dev SRS, not allowed": (right, {"allow_dev": False}, zk.Reason.DEV_SRS),
    }
    for name, (attachment, changes, reason) in cases.items():
        assert check(proven, attachment, **changes) is reason, name


def test_a_locally_made_srs_given_as_a_users_srs_is_refused(proven):
    with pytest.raises(zk.ZkError, match="not a public KZG SRS file"):
        zk.Srs.load(proven.srs.path)  # what `--srs PATH` gives


def test_a_public_srs_file_is_known_by_its_hash_and_trusted_without_the_dev_flag(proven, monkeypatch):
    # The public kzg15.srs cannot be downloaded here: the dev file stands in for it by its hash.
    monkeypatch.setitem(zk.PUBLIC_SRS_SHA256, 15, proven.srs.sha256.hex())
    production = zk.Srs.load(proven.srs.path)
    assert (production.dev, production.logrows) == (False, 15)
    assert check(proven, proven.right, allow_dev=False, srs=[production]) is zk.Reason.OK


def test_the_public_srs_hashes_are_the_ones_ezkl_itself_checks_downloads_against():
    import ezkl

    binary = b"".join(p.read_bytes() for p in Path(ezkl.__file__).parent.glob("*.so"))
    assert binary and all(known.encode() in binary for known in zk.PUBLIC_SRS_SHA256.values())


def test_inputs_of_the_wrong_shape_are_a_zk_error_naming_the_step(proven):
    with pytest.raises(zk.ZkError, match="ezkl gen_witness: .*reshape"):
        zk.prove(ANSWER_MATCH, [[1, 2, 3], [4, 5]], RECORD, proven.srs, proven.workdir)


def test_answer_codes_and_salts_are_range_checked():
    assert answer_codes(b"n:42") == [4, 110, 58, 52, 50] + [0] * 28
    with pytest.raises(zk.ZkError, match="at most 32"):
        answer_codes(b"t:" + b"x" * 31)
    with pytest.raises(zk.ZkError, match="18 bytes"):
        salt_values(b"\x00" * 17)
    with pytest.raises(zk.ZkError, match="below 2\\^15"):
        salt_values(b"\x80\x00" * 9)
    assert all(v < 1 << 15 for v in salt_values(new_salt()))


def test_a_circuit_larger_than_the_machine_can_prove_is_refused_with_a_clear_message(tmp_path):
    assert zk.max_logrows(2 << 30) == 15 and zk.max_logrows(8 << 30) == 17 and zk.max_logrows(64 << 30) == 21
    assert zk.max_logrows(512 << 20) == 0
    with pytest.raises(zk.ZkError, match="needs more memory than this machine has"):
        zk.build(dataclasses.replace(ANSWER_MATCH, logrows=zk.max_logrows() + 1), tmp_path)
    assert not any(tmp_path.iterdir())  # refused before anything was built


def test_an_unreadable_srs_file_names_the_file(tmp_path):
    with pytest.raises(zk.ZkError, match="missing.srs: cannot read the SRS file"):
        zk.Srs.load(tmp_path / "missing.srs")


def test_attachments_round_trip(proven):
    for attachment in (proven.right, proven.wrong):
        assert zk.Attachment.from_bytes(attachment.to_bytes()) == attachment


felts = st.binary(min_size=32, max_size=32)
attachments = st.builds(zk.Attachment, st.text(min_size=1, max_size=64), felts, felts, felts, felts,
                        st.lists(felts, min_size=1, max_size=8).map(tuple), st.binary(min_size=1, max_size=256))


@given(attachments)
def test_any_valid_attachment_round_trips(attachment):
    assert zk.Attachment.from_bytes(attachment.to_bytes()) == attachment


@settings(max_examples=300)
@given(st.one_of(st.binary(max_size=600), attachments.map(lambda a: a.to_bytes()).flatmap(
    lambda data: st.tuples(st.just(data), st.integers(0, len(data) - 1), st.integers(0, 255)).map(
        lambda t: t[0][:t[1]] + bytes([t[2]]) + t[0][t[1] + 1:]))))
def test_the_decoder_takes_any_bytes_and_raises_only_its_own_error(data):
    try:
        attachment = zk.Attachment.from_bytes(data)
    except zk.MalformedAttachment:
        return
    assert attachment.to_bytes() == data  # what it accepts is canonical


def test_every_build_of_a_circuit_derives_the_same_keys(proven, tmp_path):
    """ezkl writes some settings in a random order, and the key follows it: the builder sorts
    them (specs/zk.md §3), so a fresh build agrees with the run's own, with the pinned settings
    hash. One fresh build, not more: unsorted, two builds differed half the time, so each run
    catches a regression with even odds at 19 s of ezkl setup, and CI runs it on every change."""
    fresh = zk.keys(zk.build(ANSWER_MATCH, tmp_path / "fresh"), proven.srs)
    assert fresh.vk_hash == proven.right.vk_hash
    assert fresh.built.settings_hash == ANSWER_MATCH.settings_hash


def test_a_proof_with_bytes_appended_is_invalid(proven):
    """halo2 ignores trailing bytes; the pinned length gives an attachment one valid encoding."""
    appended = dataclasses.replace(proven.right, proof=proven.right.proof + b"\x00")
    assert check(proven, appended) is zk.Reason.INVALID_PROOF


def test_a_work_directory_others_may_write_is_refused(tmp_path):
    shared = tmp_path / "shared"
    shared.mkdir()
    shared.chmod(0o777)
    with pytest.raises(zk.ZkError, match="writable by no one else"):
        zk.build(ANSWER_MATCH, shared)
