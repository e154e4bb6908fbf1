"""Optional zk proofs with ezkl: small circuits for what re-execution cannot give (specs/zk.md).

Re-execution checks a rollout against public data. It cannot check a fact about a secret,
such as "this answer matches a reference answer nobody has seen". A zk proof can, when the
circuit is small: the smallest useful ezkl circuit costs a few seconds to prove on a CPU and
30 ms to check, while a real LM head is out of reach (shared/research/ezkl.md §4).

This module knows circuits, field elements and files; what a proof is *about* (a record, a
task set, a claim) is the caller's, who hands in the public inputs it expects and a 32-byte
``subject``. It never imports :mod:`vrl`.

What the module guarantees, whatever the attachment's bytes say:

* A verifier builds each circuit itself from its id, and derives its own verifying key from
  its own SRS: a key, settings or SRS that the prover sends are only compared, never used.
* An SRS made by ``ezkl.gen_srs`` is single-party: whoever made it could forge proofs. Such a
  *dev* SRS serves tests and demos; a verifier refuses its proofs unless it allows them.
* ``ezkl.verify`` raises on a bad proof; here every way a proof can fail is a :class:`Reason`,
  never an exception. Exceptions (:class:`ZkError`) are for inputs that cannot be used at all.
"""

from __future__ import annotations

import contextlib
import enum
import fcntl
import hashlib
import json
import os
import shutil
import tempfile
import threading
import warnings
from collections.abc import Callable, Iterator, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING, ParamSpec, TypedDict, TypeVar

import msgpack

from proofs.errors import ProofsError

if TYPE_CHECKING:
    import torch  # imported where used: only zk work pays for it

_P = ParamSpec("_P")
_R = TypeVar("_R")

#: The ezkl release whose circuits, keys and Poseidon these are. Every circuit's settings,
#: keys and proofs belong to one release: ezkl changed its API and its defaults in each of its
#: last majors (shared/research/ezkl.md §1.7), so another version is refused, not tried.
EZKL_VERSION = "23.0.5"
ATTACHMENT_VERSION = 1
#: A field element as ezkl writes it: 32 bytes, little-endian (BN254's scalar field).
FELT_BYTES = 32
#: BN254's scalar field order: ezkl's field. A negative value v is the element p + v.
FIELD_MODULUS = 21888242871839275222246405745257275088548364400416034343698204186575808495617
#: A KZG commitment (a compressed BN254 G1 point), as ezkl writes a polycommit column's.
POINT_BYTES = 32
#: A k=15 proof is 3,840 bytes here; 64 KiB leaves room for circuits up to k=21 with several
#: columns and bounds what a decoder holds for one attachment.
MAX_PROOF_BYTES = 1 << 16
#: Public inputs of one proof: 3 for answer-match; 4,096 bounds a batch circuit's.
MAX_INSTANCES = 4096
MAX_CIRCUIT_ID = 64
#: Logrows a machine's memory supports when proving (shared/research/ezkl.md §4,
#: recommendation 5: proving RAM is 2.3 to 2.8 times the proving key, and the key grows with
#: 2^k): k=15 took 330 MB here, k=17 fits 8 GiB, k=19 24 GiB, k=21 64 GiB.
LOGROWS_BY_MEMORY = ((1 << 30, 15), (8 << 30, 17), (24 << 30, 19), (64 << 30, 21))


class ZkError(ProofsError):
    """A zk input that cannot be used at all: ezkl missing, an SRS file unreadable, a circuit
    too large for this machine, values outside a circuit's range. A proof that fails is not
    an error: :func:`verify` returns its :class:`Reason`."""


class MalformedAttachment(ZkError, ValueError):
    """Attachment bytes that do not decode under specs/zk.md §2."""


class Reason(enum.StrEnum):
    """The outcome of checking one attachment (specs/zk.md §4), in the order checked."""

    OK = "ok"
    UNKNOWN_CIRCUIT = "zk_unknown_circuit"  # no circuit of that id here
    WRONG_SETTINGS = "zk_wrong_settings"  # built with other settings than the verifier's
    WRONG_SRS = "zk_wrong_srs"  # made against an SRS this verifier does not hold
    DEV_SRS = "zk_dev_srs"  # made against a dev (single-party) SRS, not allowed here
    WRONG_KEY = "zk_wrong_key"  # its verifying key is not the one the verifier derives
    WRONG_SUBJECT = "zk_wrong_subject"  # about another record or claim
    WRONG_INSTANCES = "zk_wrong_instances"  # public inputs other than the verifier's own
    INVALID_PROOF = "zk_invalid_proof"  # the proof does not verify


# -- the attachment -------------------------------------------------------------------------------

def _digest(value: object, name: str) -> bytes:
    if not isinstance(value, bytes) or len(value) != 32:
        raise MalformedAttachment(f"{name}: must be 32 bytes")
    return value


@dataclass(frozen=True, slots=True)
class Attachment:
    """One proof and what it claims to be (specs/zk.md §2)."""

    circuit: str  # a circuit id of CIRCUITS, e.g. "answer-match/v1"
    settings_hash: bytes  # SHA-256 of the circuit's canonical settings (settings_hash())
    vk_hash: bytes  # SHA-256 of the verifying key the prover used
    srs_hash: bytes  # SHA-256 of the SRS file the prover used
    subject: bytes  # 32 bytes naming what the proof is about (the caller's)
    instances: tuple[bytes, ...]  # public inputs, FELT_BYTES each, in the circuit's order
    proof: bytes

    def __post_init__(self) -> None:
        if not isinstance(self.circuit, str) or not 0 < len(self.circuit) <= MAX_CIRCUIT_ID:
            raise MalformedAttachment(f"circuit: must be a string of 1 to {MAX_CIRCUIT_ID} characters")
        for name in ("settings_hash", "vk_hash", "srs_hash", "subject"):
            _digest(getattr(self, name), name)
        if not isinstance(self.instances, tuple) or not 0 < len(self.instances) <= MAX_INSTANCES:
            raise MalformedAttachment(f"instances: must be 1 to {MAX_INSTANCES} field elements")
        if any(not isinstance(i, bytes) or len(i) != FELT_BYTES for i in self.instances):
            raise MalformedAttachment(f"instances: each must be {FELT_BYTES} bytes")
        if not isinstance(self.proof, bytes) or not 0 < len(self.proof) <= MAX_PROOF_BYTES:
            raise MalformedAttachment(f"proof: must be 1 to {MAX_PROOF_BYTES} bytes")

    def to_bytes(self) -> bytes:
        fields = [ATTACHMENT_VERSION, self.circuit, self.settings_hash, self.vk_hash, self.srs_hash, self.subject,
                  list(self.instances), self.proof]
        packed: bytes = msgpack.packb(fields, use_bin_type=True)  # msgpack has no types: Any to mypy
        return packed

    @classmethod
    def from_bytes(cls, data: bytes) -> Attachment:
        """Decode strictly: the exact layout of specs/zk.md §2 and nothing else."""
        if not isinstance(data, bytes) or len(data) > MAX_PROOF_BYTES + MAX_INSTANCES * (FELT_BYTES + 3) + 512:
            raise MalformedAttachment("not an attachment: too large or not bytes")
        try:
            fields = msgpack.unpackb(data, raw=False, strict_map_key=True, use_list=True,
                                     max_bin_len=MAX_PROOF_BYTES, max_str_len=MAX_CIRCUIT_ID * 4,
                                     max_array_len=MAX_INSTANCES, max_map_len=0, max_ext_len=0)
        except (ValueError, TypeError, msgpack.ExtraData, msgpack.FormatError, msgpack.StackError) as error:
            raise MalformedAttachment(f"not msgpack: {error}") from None
        if not isinstance(fields, list) or len(fields) != 8:
            raise MalformedAttachment("must be an array of 8 fields")
        if fields[0] != ATTACHMENT_VERSION or isinstance(fields[0], bool):
            raise MalformedAttachment(f"version: {fields[0]!r} is not {ATTACHMENT_VERSION}")
        if not isinstance(fields[6], list):
            raise MalformedAttachment("instances: must be an array")
        attachment = cls(fields[1], fields[2], fields[3], fields[4], fields[5], tuple(fields[6]), fields[7])
        if attachment.to_bytes() != data:
            raise MalformedAttachment("not in canonical form")
        return attachment


# -- field elements ---------------------------------------------------------------------------------

def felt(value: int) -> bytes:
    """An integer of magnitude below 2^128 as a field element (FELT_BYTES, little-endian); a
    negative ``v`` is ``p + v``, as ezkl encodes fixed-point values (specs/zk.md §3)."""
    if not isinstance(value, int) or isinstance(value, bool) or not -(1 << 128) < value < 1 << 128:
        raise ZkError(f"field element: {value!r} is not an integer in (-2^128, 2^128)")
    return (value % FIELD_MODULUS).to_bytes(FELT_BYTES, "little")


def felt_int(element: bytes) -> int:
    """The signed integer a field element stands for: ``felt``'s inverse on its range. An
    element past ``p``, or in the middle of the field (no fixed-point value of ours), is a
    ZkError: instances come from attachments, outside input."""
    if not isinstance(element, bytes) or len(element) != FELT_BYTES:
        raise ZkError(f"a field element is {FELT_BYTES} bytes")
    value = int.from_bytes(element, "little")
    if value < 1 << 128:
        return value
    if FIELD_MODULUS - (1 << 128) < value < FIELD_MODULUS:
        return value - FIELD_MODULUS
    raise ZkError(f"field element {element.hex()[:16]}...: not a value of magnitude below 2^128")


def poseidon(values: Sequence[int]) -> bytes:
    """ezkl's Poseidon hash of integers as field elements: the hash a ``hashed/public`` input
    of scale 0 shows among a proof's instances (specs/zk.md §3; vectors in specs/vectors/zk.json)."""
    _require_ezkl()
    import ezkl

    return bytes.fromhex(ezkl.poseidon_hash([felt(v).hex() for v in values])[0])


# -- SRS -------------------------------------------------------------------------------------------

#: SHA-256 of the public KZG SRS files (``kzg{k}.srs``, from the perpetual powers of tau
#: ceremony) that ezkl 23.0.5 checks downloads against: its ``src/srs_sha.rs``, each value
#: present in the installed binary (tests/test_zk.py checks so). Only these are real SRS files;
#: anything else a user names is refused (shared/research/ezkl.md §1.6). A file for ``k`` serves
#: every circuit of ``k`` rows or fewer (ezkl downsizes it).
PUBLIC_SRS_SHA256 = {
    15: "90807800a1c3b248a452e1732c45ee5099f38b737356f5542c0584ec9c3ebb45",
    16: "2a1a494630e71bc026dd5c0eab4c1b9a5dbc656228c1f0d48f5dbd3909b161d3",
    17: "41509f380362a8d14401c5ae92073154922fe23e45459ce6f696f58607655db7",
    18: "d0148475717a2ba269784a178cb0ab617bc77f16c58d4a3cbdfe785b591c7034",
    19: "d1a1655b4366a766d1578beb257849a92bf91cb1358c1a2c37ab180c5d3a204d",
    20: "54ef75911da76d7a6b7ea341998aaf66cb06c679c53e0a88a4fe070dd3add963",
    21: "486e044cf98704e07f41137d2b89698dc03d1fbf34d13b60902fea19a6013b4b",
    22: "1ee9b4396db3e4e2516ac5016626ab6ba967f091d5d23afbdb7df122a0bb9d0c",
    23: "748e48b9b6d06f9c82d26bf551d0af43ee2e801e4be56d7ccb20312e267fd1d6",
    24: "f94fa4afa2f5147680f907d4dd96a8826206c26bd3328cd379feaed614b234de",
    25: "dec49a69893fbcd66cd06296b2d936a6aceb431c130b2e52675fe4274b504f57",
    26: "b198a51d48b88181508d8e4ea9dea39db285e4585663b29b7e4ded0c22a94875",
}


@dataclass(frozen=True, slots=True)
class Srs:
    """A structured reference string file and what a verifier knows of it."""

    path: Path
    sha256: bytes
    dev: bool  # made by ezkl.gen_srs (single-party): proofs against it are insecure
    logrows: int  # the rows it serves: 2^logrows

    @classmethod
    def load(cls, path: Path | str) -> Srs:
        """A user's SRS file (``--srs PATH``): one of the public ceremony's files, by its hash
        (:data:`PUBLIC_SRS_SHA256`), or a ZkError. Never handed to ``ezkl.get_srs``, which
        deletes a file whose hash it does not know (shared/research/ezkl.md §1.6)."""
        path = Path(path)
        digest = _file_sha256(path)
        logrows = next((k for k, known in PUBLIC_SRS_SHA256.items() if known == digest.hex()), None)
        if logrows is None:
            raise ZkError(f"{path}: not a public KZG SRS file (SHA-256 {digest.hex()[:16]}... is none of the "
                          f"perpetual powers of tau kzg15..kzg26 files): a locally made SRS lets its maker forge "
                          f"proofs, so it is only ever a dev SRS (--dev-srs, --allow-dev-srs)")
        return cls(path, digest, False, logrows)


def _file_sha256(path: Path) -> bytes:
    digest = hashlib.sha256()
    try:
        with path.open("rb") as handle:
            for block in iter(lambda: handle.read(1 << 20), b""):
                digest.update(block)
    except OSError as error:
        raise ZkError(f"{path}: cannot read the SRS file ({error.strerror or error})") from None
    return digest.digest()


def dev_srs(directory: Path, logrows: int) -> Srs:
    """The dev SRS for ``logrows`` in ``directory``, made once by ``ezkl.gen_srs``: for tests
    and demos only (its maker could forge proofs). Written whole or not at all."""
    _check_logrows(logrows)
    path = Path(directory) / f"dev-kzg{logrows}.srs"
    with _locked(Path(directory)):
        if not path.exists():
            with _staging(path.parent) as staging:
                _require_ezkl()
                import ezkl

                _call(ezkl.gen_srs, str(staging / path.name), logrows)
                # A link, never a replace: an SRS some proof already names is never overwritten.
                os.link(staging / path.name, path)
    return Srs(path, _file_sha256(path), True, logrows)


# -- budget ------------------------------------------------------------------------------------------

def max_logrows(memory_bytes: int | None = None) -> int:
    """The largest circuit (in logrows) this machine's memory can prove (LOGROWS_BY_MEMORY);
    0 where even the smallest does not fit."""
    memory = _total_memory() if memory_bytes is None else memory_bytes
    return max((k for needed, k in LOGROWS_BY_MEMORY if memory >= needed), default=0)


def _total_memory() -> int:
    try:
        return os.sysconf("SC_PAGE_SIZE") * os.sysconf("SC_PHYS_PAGES")
    except (ValueError, OSError, AttributeError):
        return 0


def _check_logrows(logrows: int, memory_bytes: int | None = None) -> None:
    if not isinstance(logrows, int) or not 1 <= logrows <= 26:
        raise ZkError(f"logrows {logrows!r}: must be an integer in [1, 26]")
    limit = max_logrows(memory_bytes)
    if logrows > limit:
        raise ZkError(f"a circuit of 2^{logrows} rows needs more memory than this machine has "
                      f"(it can prove up to 2^{limit}: shared/research/ezkl.md §4)")


# -- circuits ----------------------------------------------------------------------------------------

@dataclass(frozen=True)
class Circuit:
    """A circuit: an ONNX graph made from a torch module, and how ezkl lays it out."""

    id: str
    logrows: int
    module: Callable[[], torch.nn.Module]  # the graph, as a factory
    example: Callable[[], tuple[torch.Tensor, ...]]  # example inputs, one per graph input
    input_visibility: str = "hashed/public"
    output_visibility: str = "public"
    param_visibility: str = "fixed"
    scale: int = 0  # fixed-point scale of inputs and parameters: integers here
    # Pinned, measured with ezkl 23.0.5 and torch 2.13.0 (specs/vectors/zk.json): a build that
    # differs is refused, and a proof of another length is invalid. Empty/0: not pinned.
    settings_hash: bytes = b""
    proof_bytes: int = 0


@dataclass(frozen=True)
class Built:
    """A circuit built in a work directory (:func:`build`)."""

    circuit: Circuit
    directory: Path
    settings_hash: bytes

    @property
    def settings(self) -> Path:
        return self.directory / "settings.json"

    @property
    def compiled(self) -> Path:
        return self.directory / "circuit.compiled"


@dataclass(frozen=True)
class Keys:
    """A built circuit's keys under one SRS (:func:`keys`)."""

    built: Built
    srs: Srs
    vk: Path
    pk: Path
    vk_hash: bytes


_LOCK = threading.Lock()  # with _locked's file lock: one build, setup or dev SRS at a time


def settings_hash(path: Path) -> bytes:
    """SHA-256 of the settings' canonical JSON: keys sorted, the ``timestamp`` left out, so
    that every build of one circuit by one ezkl version has the same hash (specs/zk.md §3)."""
    settings = json.loads(path.read_text())
    settings.pop("timestamp", None)
    return hashlib.sha256(json.dumps(settings, sort_keys=True, separators=(",", ":")).encode()).digest()


def build(circuit: Circuit, workdir: Path) -> Built:
    """The circuit's ONNX graph, settings and compiled form under ``workdir``, made once (in a
    staging directory, moved into place whole)."""
    _check_logrows(circuit.logrows)
    directory = Path(workdir) / f"{circuit.id.replace('/', '-')}-ezkl{EZKL_VERSION}"
    with _locked(Path(workdir)):
        if not (directory / "circuit.compiled").exists():
            with _staging(directory.parent) as staging:
                _export(circuit, staging)
                os.replace(staging, directory)  # a complete build is never replaced
    built = Built(circuit, directory, settings_hash(directory / "settings.json"))
    if circuit.settings_hash and built.settings_hash != circuit.settings_hash:
        raise ZkError(f"{circuit.id}: this machine builds settings {built.settings_hash.hex()[:16]}, not the pinned "
                      f"{circuit.settings_hash.hex()[:16]} (another torch or ezkl, or a damaged {directory})")
    return built


def compiled_with(built: Built, module: torch.nn.Module) -> Path:
    """``built``'s circuit compiled with the parameters of ``module`` (a torch module of the
    circuit's graph), made once per parameter set, found again by the parameters' SHA-256:
    for circuits whose parameters are ``polycommit``, whose keys fit every parameter set but
    whose witness needs the parameters. A module that does not lay out as ``built`` (other
    shapes) is a ZkError."""
    directory = built.directory / f"params-{_parameters_digest(module)[:32]}"
    with _locked(built.directory.parent):
        if (directory / "circuit.compiled").exists():
            return directory / "circuit.compiled"
        with _staging(built.directory) as staging:
            _export(built.circuit, staging, module, compile_circuit=False)
            if settings_hash(staging / "settings.json") != built.settings_hash:
                raise ZkError(f"{built.circuit.id}: these parameters do not lay out as the circuit's graph")
            _require_ezkl()
            import ezkl

            with _quiet(staging / "ezkl.log"):
                _call(ezkl.compile_circuit, str(staging / "circuit.onnx"), str(staging / "circuit.compiled"),
                      str(staging / "settings.json"))
            shutil.rmtree(directory, ignore_errors=True)  # an incomplete one: never a compiled circuit
            os.replace(staging, directory)
    return directory / "circuit.compiled"


def _parameters_digest(module: torch.nn.Module) -> str:
    """SHA-256 over a torch module's parameters: names, shapes, dtypes and bytes, in name order."""
    digest = hashlib.sha256()
    for name, tensor in sorted(module.state_dict().items()):
        digest.update(f"{name}/{tuple(tensor.shape)}/{tensor.dtype}\0".encode())
        digest.update(tensor.detach().contiguous().cpu().numpy().tobytes())
    return digest.hexdigest()


def params_commitment(built: Built, compiled: Path, made: Keys) -> bytes:
    """The KZG commitments of the parameters compiled into ``compiled``, as a verifier expects
    them in a proof (one POINT_BYTES point per polycommit column): they do not depend on the
    inputs (shared/research/ezkl.md §3.3), so zeros are used. One value per parameter set and
    SRS; what a trainer publishes per policy version (specs/zk.md §8)."""
    _require_ezkl()
    import ezkl

    with _staging(built.directory) as scratch:
        zeros = [[0.0] * int(x.numel()) for x in built.circuit.example()]
        (scratch / "input.json").write_text(json.dumps({"input_data": zeros}))
        with _quiet(scratch / "ezkl.log"):
            _call(ezkl.gen_witness, str(scratch / "input.json"), str(compiled), str(scratch / "witness.json"),
                  vk_path=str(made.vk), srs_path=str(made.srs.path))
        params = json.loads((scratch / "witness.json").read_text()).get("processed_params") or {}
    points = [bytes.fromhex(point) for column in params.get("polycommit") or [] for point in column]
    if not points or any(len(point) != POINT_BYTES for point in points):
        raise ZkError(f"{built.circuit.id}: ezkl made no parameter commitment (is its param_visibility polycommit?)")
    return b"".join(points)


def _export(circuit: Circuit, out: Path, module: torch.nn.Module | None = None, compile_circuit: bool = True) -> None:
    import torch

    _require_ezkl()
    import ezkl

    with warnings.catch_warnings(), torch.no_grad():
        warnings.simplefilter("ignore")  # the legacy exporter's deprecation notice
        example = circuit.example()
        # The legacy TorchScript exporter: the dynamo one writes weights beside the graph,
        # which ezkl's loader rejects (shared/research/ezkl.md §1.5).
        torch.onnx.export(module if module is not None else circuit.module(), example, str(out / "circuit.onnx"),
                          opset_version=17, dynamo=False,
                          input_names=[f"input{i}" for i in range(len(example))], output_names=["output0"])
    args = ezkl.PyRunArgs()
    # ezkl's stub declares PyRunArgs without its attributes (its pyo3 getters and setters).
    args.input_visibility, args.output_visibility = circuit.input_visibility, circuit.output_visibility  # type: ignore[attr-defined]
    args.param_visibility = circuit.param_visibility  # type: ignore[attr-defined]
    args.input_scale = args.param_scale = circuit.scale  # type: ignore[attr-defined]
    args.logrows = circuit.logrows  # type: ignore[attr-defined]
    with _quiet(out / "ezkl.log"):  # ezkl prints its layout notes (e.g. on scale 0) to stdout
        _call(ezkl.gen_settings, str(out / "circuit.onnx"), str(out / "settings.json"), py_run_args=args)
        _canonical_order(out / "settings.json")
        if compile_circuit:
            _call(ezkl.compile_circuit, str(out / "circuit.onnx"), str(out / "circuit.compiled"),
                  str(out / "settings.json"))


#: Settings that ezkl 23.0.5 writes from a hash set, in an order that changes from run to run,
#: and that the circuit's layout follows: two builds of answer-match/v1 differed in the order of
#: ``required_range_checks`` half the time, and so did their verifying keys (measured here).
UNORDERED_SETTINGS = ("required_range_checks", "required_lookups")


def _canonical_order(path: Path) -> None:
    """Sort the settings ezkl leaves unordered, before the circuit is compiled from them, so
    every build of a circuit lays it out alike and derives the same keys."""
    settings = json.loads(path.read_text())
    for key in UNORDERED_SETTINGS:
        if isinstance(settings.get(key), list):
            settings[key] = sorted(settings[key], key=lambda item: json.dumps(item, sort_keys=True))
    path.write_text(json.dumps(settings))


def keys(built: Built, srs: Srs) -> Keys:
    """The proving and verifying keys of ``built`` under ``srs``, made once per SRS: ezkl's
    setup is deterministic, so every party that builds the circuit derives the same keys."""
    if srs.logrows < built.circuit.logrows:
        raise ZkError(f"{srs.path}: an SRS of 2^{srs.logrows} rows is too small for {built.circuit.id} "
                      f"(2^{built.circuit.logrows} rows)")
    directory = built.directory / f"keys-{srs.sha256.hex()[:16]}"
    with _locked(built.directory.parent):
        if not (directory / "vk.key").exists():
            with _staging(built.directory.parent) as staging:
                _require_ezkl()
                import ezkl

                # ezkl's stub leaves out the defaults of witness_path and disable_selector_compression.
                _call(ezkl.setup, str(built.compiled), str(staging / "vk.key"), str(staging / "pk.key"),  # type: ignore[call-arg]
                      srs_path=str(srs.path))
                os.replace(staging, directory)
    return Keys(built, srs, directory / "vk.key", directory / "pk.key",
                hashlib.sha256((directory / "vk.key").read_bytes()).digest())


# -- proving and verifying ---------------------------------------------------------------------------

def prove(circuit: Circuit, inputs: Sequence[Sequence[int]], subject: bytes, srs: Srs, workdir: Path,
          params: torch.nn.Module | None = None) -> Attachment:
    """Prove ``circuit`` on ``inputs`` (one list of integers per graph input, at the circuit's
    scale: value ``v`` stands for ``v / 2^scale``), with the parameters of the torch module
    ``params`` where the circuit's are polycommit. A witness that does not satisfy the circuit
    is a ZkError before any proof is made: ezkl's ``prove`` runs unchecked and would return a
    "proof" that cannot verify (shared/research/ezkl.md §3)."""
    _digest(subject, "subject")
    built = build(circuit, workdir)
    made = keys(built, srs)
    compiled = compiled_with(built, params) if params is not None else built.compiled
    _require_ezkl()
    import ezkl

    with _staging(Path(workdir)) as scratch:
        _witness(circuit, inputs, compiled, made, scratch)
        try:
            ezkl.mock(str(scratch / "witness.json"), str(compiled))
        except RuntimeError as error:
            raise ZkError(f"{circuit.id}: the inputs do not satisfy the circuit ({error})") from None
        _call(ezkl.prove, str(scratch / "witness.json"), str(compiled), str(made.pk),
              proof_path=str(scratch / "proof.json"), srs_path=str(srs.path))
        written = json.loads((scratch / "proof.json").read_text())
    (instances,) = written["instances"]
    return Attachment(circuit.id, made.built.settings_hash, made.vk_hash, srs.sha256, subject,
                      tuple(bytes.fromhex(i) for i in instances), bytes(written["proof"]))


def outputs(circuit: Circuit, inputs: Sequence[Sequence[int]], workdir: Path, srs: Srs,
            params: torch.nn.Module | None = None) -> list[int]:
    """What ``circuit`` outputs on ``inputs`` (as :func:`prove` takes them), as signed integers at
    its scale, without proving: the values a proof's output instances would hold."""
    built = build(circuit, workdir)
    made = keys(built, srs)
    compiled = compiled_with(built, params) if params is not None else built.compiled
    with _staging(Path(workdir)) as scratch:
        witness = _witness(circuit, inputs, compiled, made, scratch)
    return [felt_int(bytes.fromhex(value)) for output in witness["outputs"] for value in output]


class _Witness(TypedDict):
    """What is read of ezkl's witness JSON (it holds more)."""

    outputs: list[list[str]]  # per graph output, its values as hex field elements


def _witness(circuit: Circuit, inputs: Sequence[Sequence[int]], compiled: Path, made: Keys,
             scratch: Path) -> _Witness:
    """ezkl's witness for ``inputs`` in ``scratch/witness.json``, and as a dict."""
    # v / 2^scale is exact in float64 for |v| < 2^53, so ezkl's own quantization gives v back.
    data = [[float(v) / (1 << circuit.scale) for v in x] for x in inputs]
    (scratch / "input.json").write_text(json.dumps({"input_data": data}))
    _require_ezkl()
    import ezkl

    _call(ezkl.gen_witness, str(scratch / "input.json"), str(compiled), str(scratch / "witness.json"),
          vk_path=str(made.vk), srs_path=str(made.srs.path))
    witness: _Witness = json.loads((scratch / "witness.json").read_text())  # as ezkl 23.0.5 writes it
    return witness


def verify(attachment: Attachment, circuits: dict[str, Circuit], *, subject: bytes, instances: Sequence[bytes],
           srs: Sequence[Srs], workdir: Path, allow_dev: bool = False, params: bytes | None = None) -> Reason:
    """Check one attachment against what the verifier derives itself: the circuit from its id,
    the settings and keys from its own build and SRS, the subject and the public inputs from
    the caller, and for polycommit parameters, ``params``, the commitment it expects
    (:func:`params_commitment`). Returns :data:`Reason.OK` or the first reason it fails
    (specs/zk.md §4)."""
    circuit = circuits.get(attachment.circuit)
    if circuit is None:
        return Reason.UNKNOWN_CIRCUIT
    built = build(circuit, workdir)
    if attachment.settings_hash != built.settings_hash:
        return Reason.WRONG_SETTINGS
    held = next((s for s in srs if s.sha256 == attachment.srs_hash), None)
    if held is None:
        return Reason.WRONG_SRS
    if held.dev and not allow_dev:
        return Reason.DEV_SRS
    made = keys(built, held)
    if attachment.vk_hash != made.vk_hash:
        return Reason.WRONG_KEY
    if attachment.subject != subject:
        return Reason.WRONG_SUBJECT
    if attachment.instances != tuple(instances):
        return Reason.WRONG_INSTANCES
    if circuit.proof_bytes and len(attachment.proof) != circuit.proof_bytes:
        return Reason.INVALID_PROOF  # halo2 ignores trailing bytes: a proof has one length, or none
    # For polycommit parameters: the points of the commitment the verifier expects.
    points: list[str] | None = None
    if circuit.param_visibility == "polycommit":
        if not isinstance(params, bytes) or not params or len(params) % POINT_BYTES:
            raise ZkError(f"{circuit.id}: checking its proofs needs the parameters' commitment "
                          f"(a multiple of {POINT_BYTES} bytes)")
        points = [params[i:i + POINT_BYTES].hex() for i in range(0, len(params), POINT_BYTES)]
    _require_ezkl()
    import ezkl

    with _staging(Path(workdir)) as scratch:
        # Only what verify reads: the instances (the verifier's own) and the proof bytes.
        (scratch / "proof.json").write_text(json.dumps({"protocol": None, "proof": list(attachment.proof),
                                                        "instances": [[i.hex() for i in instances]]}))
        if points is not None:
            # The proof carries the prover's commitment; the verifier's own replaces it, so a
            # proof made with other parameters does not verify (shared/research/ezkl.md §3.3).
            # ezkl reads these witness fields and no others here (measured on 23.0.5; without
            # "version" it logs a warning per proof).
            (scratch / "witness.json").write_text(json.dumps({
                "inputs": [], "outputs": [], "max_lookup_inputs": 0, "min_lookup_inputs": 0, "max_range_size": 0,
                "version": EZKL_VERSION, "processed_params": {"polycommit": [points], "poseidon_hash": None}}))
            try:
                with _quiet(scratch / "ezkl.log"):  # it prints whether the proof changed
                    ezkl.swap_proof_commitments(str(scratch / "proof.json"), str(scratch / "witness.json"))
            except BaseException as error:
                if isinstance(error, (KeyboardInterrupt, SystemExit)):
                    raise
                raise ZkError(f"{circuit.id}: the parameters' commitment is not a curve point") from None
        try:
            # ezkl's stub leaves out reduced_srs's default.
            ok = ezkl.verify(str(scratch / "proof.json"), str(built.settings), str(made.vk),  # type: ignore[call-arg]
                             srs_path=str(held.path))
        except BaseException as error:  # ezkl raises for a proof that fails; Rust panics are BaseExceptions
            if isinstance(error, (KeyboardInterrupt, SystemExit)):
                raise
            return Reason.INVALID_PROOF
    return Reason.OK if ok is True else Reason.INVALID_PROOF


# -- internals ---------------------------------------------------------------------------------------

def _require_ezkl() -> None:
    """Import ezkl on first use (4 s; only zk work pays it), and check it is the pinned
    version: each caller imports it after this, from the modules already loaded."""
    try:
        import ezkl
    except ImportError:
        raise ZkError(f"zk proofs need ezkl=={EZKL_VERSION}: pip install ezkl=={EZKL_VERSION}") from None
    if getattr(ezkl, "__version__", None) != EZKL_VERSION:
        raise ZkError(f"zk proofs need ezkl=={EZKL_VERSION}, found {getattr(ezkl, '__version__', 'unknown')}")


def _call(function: Callable[_P, _R], *args: _P.args, **kwargs: _P.kwargs) -> _R:
    """An ezkl call whose failure is a ZkError naming the step: ezkl raises RuntimeError, and a
    Rust panic (an SRS too small for the circuit, say) arrives as pyo3's PanicException, a
    BaseException."""
    try:
        return function(*args, **kwargs)
    except BaseException as error:
        if isinstance(error, (KeyboardInterrupt, SystemExit)):
            raise
        raise ZkError(f"ezkl {function.__name__}: {str(error).splitlines()[0] if str(error) else error!r}") from None


@contextlib.contextmanager
def _locked(directory: Path) -> Iterator[None]:
    """Hold ``directory``'s lock (this process's threads and other processes alike), making
    the directory first, private to its user (0700): a verifier builds its circuits and keys
    there and trusts them, so no one else may write into it."""
    directory.mkdir(mode=0o700, parents=True, exist_ok=True)
    info = directory.stat()
    if info.st_uid != os.getuid() or info.st_mode & 0o022:
        raise ZkError(f"{directory}: the zk work directory must be the user's own and writable by no one else "
                      f"(owner {info.st_uid}, mode {oct(info.st_mode & 0o777)})")
    with _LOCK, open(directory / ".lock", "a") as handle:
        fcntl.flock(handle, fcntl.LOCK_EX)
        try:
            yield
        finally:
            fcntl.flock(handle, fcntl.LOCK_UN)


#: File descriptors 1 and 2 are the process's: one redirection at a time, or two threads that
#: overlap would leave them pointing at the first one's log when they restore them.
_QUIET = threading.Lock()


@contextlib.contextmanager
def _quiet(log: Path) -> Iterator[None]:
    """Send what native code prints to file descriptors 1 and 2 to ``log`` instead."""
    with _QUIET, log.open("ab") as sink:
        saved = [os.dup(1), os.dup(2)]
        try:
            for fd in (1, 2):
                os.dup2(sink.fileno(), fd)
            yield
        finally:
            for fd, copy in zip((1, 2), saved):
                os.dup2(copy, fd)
                os.close(copy)


@contextlib.contextmanager
def _staging(parent: Path) -> Iterator[Path]:
    """A fresh directory beside the destination, removed unless moved into place."""
    parent.mkdir(parents=True, exist_ok=True)
    path = Path(tempfile.mkdtemp(prefix=".staging-", dir=parent))
    try:
        yield path
    finally:
        shutil.rmtree(path, ignore_errors=True)
