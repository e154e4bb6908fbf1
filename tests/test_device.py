"""The code that must run on an accelerator, checked on a machine without one.

Every tensor a forward path feeds the network must be made on the network's device, and
everything the sampler and the commitments compute must stay on the host. Under
``torch.device("meta")`` as the default device, a tensor made without naming its device lands
on ``meta`` and the first operation that mixes it with the CPU-resident model fails: the same
mistake that would put an input on the CPU next to a CUDA model. What it cannot catch is a
tensor made on the host on purpose and then never moved; those few moves
(``vrl.rollouts.forward.HOST``) are read, not tested, until a GPU run.
"""

from __future__ import annotations


import pytest
import torch

import vrl
from tests.conftest import ROUND, TASKS
from vrl.rollouts.model import ModelError, resolve_device
from vrl.rollouts.verify import Stage


def test_device_names_resolve_or_fail_clearly():
    assert resolve_device("cpu") == torch.device("cpu")
    assert resolve_device("auto") == torch.device("cuda" if torch.cuda.is_available() else "cpu")
    for name, problem in (("mps", "unsupported device"), ("no-such-thing", "unknown device"),
                          ("cuda:64", "CUDA device")):
        with pytest.raises(ModelError, match=problem):
            resolve_device(name)
    if not torch.cuda.is_available():
        with pytest.raises(ModelError, match="sees no CUDA device"):
            vrl.load_model("tiny", device="cuda")


def test_generate_and_verify_make_no_tensor_off_the_models_device(tiny, node, sampling, honest):
    with torch.device("meta"):
        rollouts = vrl.generate(tiny, TASKS, node, round_seed=ROUND, sampling=sampling, groups=3, group_size=4,
                                batch_size=12)
        assert rollouts == honest  # the same bytes as with the CPU as the default device
        edited = list(rollouts[0].completion_tokens)
        edited[0] = (edited[0] + 1) % tiny.vocab_size
        rollouts[1] = rollouts[0].signed(node, completion_tokens=tuple(edited), sample_index=1)
        verdicts = vrl.verify(rollouts, tiny)
    assert [v.accepted for v in verdicts] == [True, False] + [True] * 10
    assert verdicts[1].stage is not Stage.ACCEPTED
