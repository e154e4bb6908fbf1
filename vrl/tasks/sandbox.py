"""The ``code/v1`` reward: a completion's Python run against the task's tests in a separate,
resource-limited process (specs/rewards.md §3.6; what it does and does not isolate is
specs/security.md's "Code rewards" rows).

Not a container. The child is a fresh interpreter with no site-packages, an environment of
our own, an empty read-only working directory and POSIX resource limits (address space, CPU
seconds, file size, no core dumps, no new processes), killed with its process group at a
wall-clock deadline; where the kernel lets an unprivileged process make a user namespace it
also gets an empty network namespace (no interface but a down loopback). It can still read
whatever files the verifier's user can read, and write where that user can write.

The child is set up in two steps, both in the child: a first interpreter drops into the new
namespaces, sets the limits and ``PR_SET_NO_NEW_PRIVS``, then ``exec``\\ s the runner, which
starts without the capabilities the new user namespace granted. Nothing runs between
``fork`` and ``exec`` in the verifier itself (no ``preexec_fn``: the verifier has torch's
threads, and ``preexec_fn`` is unsafe with threads).
"""

from __future__ import annotations

import math
import os
import re
import secrets
import signal
import subprocess
import sys
import tempfile
from collections.abc import Mapping
from pathlib import Path

#: Code and tests past these sizes score 0 without running (specs/rewards.md §3.6): 64 KiB is
#: far past a benchmark solution (HumanEval/MBPP solutions and tests are a few KiB) and keeps
#: what a record makes every verifier write and compile small.
MAX_CODE_BYTES = 64 << 10
MAX_TESTS_BYTES = 64 << 10
#: Parameter ranges of code/v1 (time_ms, memory_mb): 100 ms is above an interpreter's start on
#: the reference machine (~20 ms with -S); 60 s and 8 GiB bound what one record can cost.
TIME_MS = range(100, 60_001)
MEMORY_MB = range(64, 8193)
#: A written file (stdout included) past 1 MiB kills the child (RLIMIT_FSIZE): output is never
#: read beyond the runner's last line.
FILE_BYTES = 1 << 20
OPEN_FILES = 64
#: Wall-clock allowance on top of time_ms for starting the two interpreters: the limit is on
#: the code, not on the machine's process start (about 40 ms here; a loaded verifier is slower).
START_MS = 1000

_FENCE = re.compile(r"```(?:python|py|python3)[ \t]*\r?\n(.*?)```", re.DOTALL)

# Step 1, in the child: namespaces, limits, no new privileges, then exec the runner.
_SETUP = r"""
import ctypes, os, resource, sys
libc = ctypes.CDLL(None, use_errno=True)
libc.unshare(0x10000000 | 0x40000000)  # CLONE_NEWUSER | CLONE_NEWNET; refused where not allowed
libc.prctl(38, 1, 0, 0, 0)  # PR_SET_NO_NEW_PRIVS
cpu, memory, fsize, nofile = map(int, sys.argv[1:5])
for limit, value in ((resource.RLIMIT_CPU, cpu), (resource.RLIMIT_AS, memory), (resource.RLIMIT_FSIZE, fsize),
                     (resource.RLIMIT_CORE, 0), (resource.RLIMIT_NOFILE, nofile), (resource.RLIMIT_NPROC, 0)):
    resource.setrlimit(limit, (value, value))
os.execv(sys.executable, [sys.executable, *sys.argv[5:]])
"""
# Step 2: the code, then the tests, in one namespace; the nonce (read before the code runs,
# never on disk) is printed only once the tests finished, so code that exits early with
# status 0 (os._exit(0)) does not pass.
_RUNNER = r"""
def main():
    import sys
    nonce = sys.stdin.readline().strip()
    sys.stdin.close()
    namespace = {"__name__": "solution", "__builtins__": __builtins__}
    try:
        exec(compile(open("solution.py", encoding="utf-8").read(), "solution.py", "exec"), namespace)
        exec(compile(open("tests.py", encoding="utf-8").read(), "tests.py", "exec"), namespace)
    except BaseException:
        sys.exit(1)
    sys.__stdout__.write("\n" + nonce + "\n")
    sys.__stdout__.flush()
main()
"""
# The whole environment the child sees: fixed, so a test's hash order and text encoding are
# the same on every verifier (hence not -E/-I, which would ignore PYTHONHASHSEED; -S -s -P -B
# are -I's isolation otherwise: no site-packages, no user site, no script dir on the path).
_ENV = {"PATH": "/usr/bin:/bin", "PYTHONHASHSEED": "0", "PYTHONUTF8": "1", "LC_ALL": "C.UTF-8", "HOME": "/nonexistent"}
_FLAGS = ("-S", "-s", "-P", "-B")


def extract_code(completion: str) -> str | None:
    """The content of the completion's last fenced block opened with ```python (or ```py,
    ```python3) and closed with ```; None when it has none."""
    blocks = _FENCE.findall(completion)
    return blocks[-1] if blocks else None


def limits_problem(params: Mapping) -> str | None:
    """What is wrong with code/v1's parameters, or None."""
    if params["time_ms"] not in TIME_MS or params["memory_mb"] not in MEMORY_MB:
        return (f"time_ms must be in [{TIME_MS.start}, {TIME_MS.stop - 1}] and memory_mb in "
                f"[{MEMORY_MB.start}, {MEMORY_MB.stop - 1}]")
    return None


def code_reward(completion: str, tests: str, params: Mapping) -> float:
    """1.0 when the completion's code passes ``tests`` within the limits, else 0.0 (no code,
    code or tests too large, a failing assertion, an exception, a timeout, a limit hit)."""
    code = extract_code(completion)
    if code is None or len(code.encode("utf-8", "replace")) > MAX_CODE_BYTES \
            or len(tests.encode("utf-8", "replace")) > MAX_TESTS_BYTES:
        return 0.0
    return float(run_tests(code, tests, int(params["time_ms"]), int(params["memory_mb"])))


def run_tests(code: str, tests: str, time_ms: int, memory_mb: int) -> bool:
    """Whether ``code`` then ``tests`` run to the end in a sandboxed child within the limits."""
    if os.name != "posix":
        raise OSError("code rewards run only on POSIX systems (resource limits, process groups)")
    nonce = secrets.token_hex(16)
    with tempfile.TemporaryDirectory(prefix="vrl-code-") as work:
        root = Path(work)
        (root / "solution.py").write_text(code, encoding="utf-8", errors="replace")
        (root / "tests.py").write_text(tests, encoding="utf-8", errors="replace")
        output = root / "stdout"
        output.touch()
        root.chmod(0o555)  # the code cannot create files beside the ones it was given
        try:
            passed = _run(root, output, nonce, time_ms, memory_mb)
        finally:
            root.chmod(0o755)
    return passed


def _run(root: Path, output: Path, nonce: str, time_ms: int, memory_mb: int) -> bool:
    limits = (math.ceil(time_ms / 1000), memory_mb << 20, FILE_BYTES, OPEN_FILES)
    command = [sys.executable, *_FLAGS, "-c", _SETUP, *map(str, limits), *_FLAGS, "-c", _RUNNER]
    with output.open("wb") as sink:
        child = subprocess.Popen(command, cwd=root, env=_ENV, stdin=subprocess.PIPE, stdout=sink,
                                 stderr=subprocess.DEVNULL, start_new_session=True, close_fds=True)
        try:
            try:
                child.stdin.write(nonce.encode() + b"\n")
                child.stdin.close()
            except BrokenPipeError:  # it died before reading: a failure, judged by its status below
                pass
            status = child.wait(timeout=(time_ms + START_MS) / 1000)
        except subprocess.TimeoutExpired:
            status = None
        finally:
            try:  # the child and anything it left in its session
                os.killpg(child.pid, signal.SIGKILL)
            except ProcessLookupError:
                pass
            child.wait()
    if status != 0:
        return False
    with output.open("rb") as read:
        read.seek(max(0, output.stat().st_size - 256))
        tail = read.read().split(b"\n")
    return len(tail) >= 2 and tail[-2] == nonce.encode() and tail[-1] == b""
