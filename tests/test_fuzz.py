"""Every decoder and handler that reads a stranger's bytes, fuzzed with Hypothesis.

The targets live in ``tests/fuzzing.py``; ``bench/fuzz.py`` runs the same ones at depth
(10,000 cases each). Here each target gets a short run of raw bytes and of mutated valid
inputs: the property is that a case ends in a value or the target's own error type, within
``fuzzing.CASE_SECONDS``, and that nothing a node accepted before is lost.
"""

from __future__ import annotations

import fuzzing
import pytest
from hypothesis import HealthCheck, given, settings

# ~60 s for the whole file on this machine kind (issue 13 §5); bench/fuzz.py goes deep.
EXAMPLES = 60
NAMES = [t.name for t in fuzzing.message_targets() + fuzzing.file_targets()] + list(fuzzing.NODE_TARGETS)


@pytest.fixture(scope="module")
def targets(tmp_path_factory):
    node = fuzzing.NodeUnderFire(tmp_path_factory.mktemp("fuzz-node"))
    yield {t.name: t for t in fuzzing.all_targets(node)}
    node.close()


@pytest.mark.parametrize("strategy", ["raw", "structured"])
@pytest.mark.parametrize("name", NAMES)
def test_no_input_crashes_a_decoder_or_handler(targets, name, strategy):
    target, tally = targets[name], fuzzing.Tally()

    @settings(max_examples=EXAMPLES, deadline=None, database=None, derandomize=True,
              suppress_health_check=list(HealthCheck))
    @given(data=getattr(target, strategy)())
    def case(data: bytes) -> None:
        tally.record(target, data, raise_crashes=True)

    case()
    assert tally.cases >= min(EXAMPLES, 10)
