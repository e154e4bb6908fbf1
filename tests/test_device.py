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
from vrl.rollouts.model import MAX_PLATFORM_BYTES, ModelError, platform_tag, resolve_device
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


def test_generate_and_verify_make_no_tensor_off_the_models_device(tiny, node, sampling):
    def made() -> list[vrl.Rollout]:
        return vrl.generate(tiny, TASKS, node, round_seed=ROUND, sampling=sampling, groups=3, group_size=4,
                            batch_size=12)

    # The reference is made here, beside the run it is compared with, not taken from the session's
    # `honest`: its bytes depend on the process's thread count when it was made (a race decided by
    # one reduction order), which earlier tests may have left different (a full run once did).
    honest = made()
    with torch.device("meta"):
        rollouts = made()
        assert rollouts == honest  # the same bytes as with the CPU as the default device
        edited = list(rollouts[0].completion_tokens)
        edited[0] = (edited[0] + 1) % tiny.vocab_size
        rollouts[1] = rollouts[0].signed(node, completion_tokens=tuple(edited), sample_index=1)
        verdicts = vrl.verify(rollouts, tiny)
    assert [v.accepted for v in verdicts] == [True, False] + [True] * 10
    assert verdicts[1].stage is not Stage.ACCEPTED


def test_platform_tags_differ_wherever_recomputed_digests_may(tiny, monkeypatch):
    """The daemon once said ``cpu/float32`` whatever its device (issue 14 §5): honest verifiers
    on different GPUs claimed one platform, produced different digests, and a differing digest
    on one platform is a hard fail. The tag names what changes the low bits of a hidden state."""
    from dataclasses import replace as copy_with

    base = platform_tag(tiny)
    assert base.startswith(f"torch-{torch.__version__}/cpu-") and "/float32/sdpa/" in base
    threads = torch.get_num_threads()
    try:
        torch.set_num_threads(threads + 1)  # reductions split another way
        assert platform_tag(tiny) != base
    finally:
        torch.set_num_threads(threads)
    assert platform_tag(copy_with(tiny, dtype_name="bfloat16")) != base
    other = "AVX512" if torch.backends.cpu.get_cpu_capability() == "AVX2" else "AVX2"  # other CPU kernels
    monkeypatch.setattr(torch.backends.cpu, "get_cpu_capability", lambda: other)
    assert platform_tag(tiny) != base
    monkeypatch.undo()

    # A model on a GPU, seen without one: the tag follows the device's name and CUDA version.
    import vrl.rollouts.model as model_module

    monkeypatch.setattr(model_module, "network_device", lambda network: torch.device("cuda:0"))
    names = iter(["NVIDIA H100 80GB HBM3", "NVIDIA A100-SXM4-40GB"])
    monkeypatch.setattr(torch.cuda, "get_device_name", lambda device: next(names))
    h100, a100 = platform_tag(tiny), platform_tag(tiny)
    assert len({base, h100, a100}) == 3 and "NVIDIA H100" in h100
    monkeypatch.setattr(torch.cuda, "get_device_name", lambda device: "N" * 500)
    assert len(platform_tag(tiny).encode()) <= MAX_PLATFORM_BYTES  # fits a verdict's field
