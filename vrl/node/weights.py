"""Policy weights as one content-addressed blob, and loading one back with its hash checked.

The blob is the safetensors serialization of the network's state dict (tied duplicates kept,
names sorted by safetensors itself), so the same weights give the same bytes. A node trusts
a blob only when both its SHA-256 matches the announcement's ``blob`` and the weights it
loads hash to the announcement's ``model_hash`` (``specs/network.md`` §Policy distribution).
"""

from __future__ import annotations

import copy
import hashlib

from safetensors import SafetensorError
from safetensors.torch import load as load_tensors
from safetensors.torch import save as save_tensors

from vrl.errors import VrlError
from vrl.rollouts.model import Model


class WeightsError(VrlError):
    """A blob that does not decode, does not fit the architecture, or hashes wrong."""


def to_blob(model: Model) -> bytes:
    state = {name: tensor.detach().cpu().contiguous() for name, tensor in model.network.state_dict().items()}
    # safetensors refuses tensors that share storage (tied embeddings); copies keep both names.
    return save_tensors({name: tensor.clone() for name, tensor in state.items()})


def from_blob(skeleton: Model, blob: bytes, *, blob_hash: bytes, model_hash: bytes, name: str) -> Model:
    """A new :class:`Model` with ``skeleton``'s architecture and tokenizer and the blob's weights."""
    if hashlib.sha256(blob).digest() != blob_hash:
        raise WeightsError(f"{name}: blob does not match its SHA-256")
    try:
        tensors = load_tensors(blob)
    except (SafetensorError, ValueError) as error:
        raise WeightsError(f"{name}: not a safetensors blob: {error}") from None
    network = copy.deepcopy(skeleton.network)
    live = network.state_dict()
    if set(tensors) != set(live) or any(tensors[k].shape != live[k].shape for k in live):
        raise WeightsError(f"{name}: tensor names or shapes differ from the {skeleton.name} architecture")
    network.load_state_dict(tensors)
    network.eval().requires_grad_(False)
    model = Model(name=name, network=network, tokenizer=skeleton.tokenizer, dtype_name=skeleton.dtype_name)
    if model.model_hash != model_hash:
        raise WeightsError(f"{name}: weights hash to {model.model_hash.hex()[:16]}, "
                           f"announced {model_hash.hex()[:16]}")
    return model
