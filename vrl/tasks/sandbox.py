"""The ``code/v1`` reward: a completion's Python run against the task's tests in a separate,
resource-limited process (specs/rewards.md §3.6; what it does and does not isolate is
specs/security.md's "Code rewards" rows).

Not a container. The child is a fresh interpreter with no site-packages, an environment of
our own, a read-only working directory, POSIX resource limits (address space, CPU seconds,
file size, no core dumps) and new user, network and PID namespaces: it is PID 1 of its own
PID namespace, so killing it kills every process it started, however it detached them
(``setsid``, double forks), and it cannot address the verifier's processes. It can still read
whatever files the verifier's user can read, and write where that user can write.

Three processes, none of it in the verifier between ``fork`` and ``exec`` (no ``preexec_fn``:
the verifier has torch's threads, and ``preexec_fn`` is unsafe with threads):

1. the **watchdog**, a first interpreter the verifier starts in a new session: it unshares
   the user, network and PID namespaces (or exits with :data:`UNAVAILABLE`: without them the
   reward is not computable here, never computed in another environment), forks, and kills
   its child at the wall-clock deadline;
2. its child, PID 1 of the new namespace, sets the limits, ``PR_SET_NO_NEW_PRIVS`` and
   ``PR_SET_PDEATHSIG`` (it dies with the watchdog), then ``exec``\\ s
3. the **runner**, which starts without the capabilities the new user namespace granted,
   reads the tests, then runs the code and the tests.

The verifier's own deadline comes after the watchdog's; at it, it kills the watchdog's
process group, and the namespace dies with the watchdog.
"""

from __future__ import annotations

import functools
import hashlib
import math
import os
import re
import secrets
import signal
import subprocess
import sys
import tempfile
import threading
from collections import OrderedDict
from collections.abc import Mapping
from pathlib import Path

from vrl.errors import VrlError

#: Code and tests past these sizes score 0 without running (specs/rewards.md §3.6): 64 KiB is
#: far past a benchmark solution (HumanEval/MBPP solutions and tests are a few KiB) and keeps
#: what a record makes every verifier write and compile small.
MAX_CODE_BYTES = 64 << 10
MAX_TESTS_BYTES = 64 << 10
#: Parameter ranges of code/v1 (time_ms, memory_mb): 100 ms is above an interpreter's start on
#: the reference machine (~20 ms with -S); 60 s and 8 GiB bound what one record can cost.
TIME_MS = range(100, 60_001)
MEMORY_MB = range(64, 8193)
#: code/v1's ``python``: a CPython major.minor version (specs/rewards.md §3.6).
PYTHON_VERSION = re.compile(r"3\.[0-9]{1,2}", re.ASCII)
#: A written file (stdout included) past 1 MiB kills the child (RLIMIT_FSIZE): output is never
#: read beyond the runner's last line.
FILE_BYTES = 1 << 20
OPEN_FILES = 64
#: Wall-clock allowance on top of time_ms for starting the runner's interpreter: the limit is
#: on the code, not on the machine's process start (about 40 ms here; a loaded verifier is slower).
START_MS = 1000
#: The verifier's own deadline comes this long after the watchdog's, which also has to start
#: an interpreter: the watchdog, not the verifier, is what normally ends a slow child.
WATCHDOG_MS = 1000
#: The watchdog's exit status when it cannot make the sandbox (no namespaces, no fork, no
#: exec): the reward is not computable here. The runner's own statuses are mapped to 0 and 1.
UNAVAILABLE = 125
#: The interpreter the child runs: this one (a module-level setting, so a test can point it at
#: a path that does not exist and see the verifier call the reward not computable).
INTERPRETER = sys.executable



class SandboxUnavailable(VrlError, OSError):
    """The sandbox cannot be made on this machine (no namespaces, no fork, no interpreter, no
    temporary directory): the code reward is not computable here, which says nothing about
    the code (vrl.tasks.rewards turns it into ``RewardUnavailable``)."""


_FENCE = re.compile(r"```(?:python|py|python3)[ \t]*\r?\n(.*?)```", re.DOTALL)

# Step 1, the watchdog: namespaces, then a child that is PID 1 of the new PID namespace.
_SETUP = r"""
import ctypes, os, resource, signal, sys
try:
    libc = ctypes.CDLL(None, use_errno=True)
    if not (hasattr(libc, "unshare") and hasattr(libc, "prctl")):
        os._exit(125)
    if libc.unshare(0x10000000 | 0x40000000 | 0x20000000) != 0:  # CLONE_NEWUSER | CLONE_NEWNET | CLONE_NEWPID
        os._exit(125)
    deadline = int(sys.argv[1]) / 1000
    cpu, memory, fsize, nofile = map(int, sys.argv[2:6])
    failed, report = os.pipe()  # close-on-exec: empty at EOF when the runner's exec succeeded
    pid = os.fork()
except BaseException:
    os._exit(125)
if pid == 0:
    try:
        os.close(failed)
        libc.prctl(1, signal.SIGKILL, 0, 0, 0)  # PR_SET_PDEATHSIG: the namespace dies with its watchdog
        libc.prctl(38, 1, 0, 0, 0)  # PR_SET_NO_NEW_PRIVS
        for limit, value in ((resource.RLIMIT_CPU, cpu), (resource.RLIMIT_AS, memory),
                             (resource.RLIMIT_FSIZE, fsize), (resource.RLIMIT_CORE, 0),
                             (resource.RLIMIT_NOFILE, nofile), (resource.RLIMIT_NPROC, 0)):
            resource.setrlimit(limit, (value, value))
        os.execv(sys.executable, [sys.executable, *sys.argv[6:]])
    finally:
        os.write(report, b"x")
        os._exit(125)
os.close(report)
if os.read(failed, 1):
    os.waitpid(pid, 0)
    os._exit(125)
def expire(*_):
    try:
        os.kill(pid, signal.SIGKILL)  # the namespace's init: every process in it dies with it
    except ProcessLookupError:
        pass
signal.signal(signal.SIGALRM, expire)
signal.setitimer(signal.ITIMER_REAL, deadline)
_, status = os.waitpid(pid, 0)
signal.setitimer(signal.ITIMER_REAL, 0)
os._exit(0 if status == 0 else 1)
"""
# Step 2, the runner: the tests are read before the code runs (code that rewrites tests.py
# changes nothing), then the code and the tests run in one namespace. The nonce (read before
# the code runs, never on disk) is printed only once the tests finished, so code that exits
# early with status 0 (os._exit(0)) does not pass; code that looks for the nonce in the
# runner's frames can find it (specs/rewards.md §3.6: the harness is not defended).
_RUNNER = r"""
def main():
    import sys
    nonce = sys.stdin.readline().strip()
    sys.stdin.close()
    with open("solution.py", encoding="utf-8") as file:
        code = file.read()
    with open("tests.py", encoding="utf-8") as file:
        tests = file.read()
    namespace = {"__name__": "solution", "__builtins__": __builtins__}
    try:
        exec(compile(code, "solution.py", "exec"), namespace)
        exec(compile(tests, "tests.py", "exec"), namespace)
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


def limits_problem(params: Mapping[str, object]) -> str | None:
    """What is wrong with code/v1's parameters, or None."""
    if params["time_ms"] not in TIME_MS or params["memory_mb"] not in MEMORY_MB:
        return (f"time_ms must be in [{TIME_MS.start}, {TIME_MS.stop - 1}] and memory_mb in "
                f"[{MEMORY_MB.start}, {MEMORY_MB.stop - 1}]")
    if not PYTHON_VERSION.fullmatch(str(params["python"])):
        return f"python must be a version 3.N, got {str(params['python'])[:40]!r}"
    return None


def sandbox_problem() -> str | None:
    """Why the sandbox cannot be made on this machine, or None: a platform other than Linux,
    a kernel (or container) that refuses the namespaces, an interpreter that does not start.
    The environment is part of the reward: a verifier that cannot give the child the same one
    does not score the code in another."""
    return _sandbox_problem(INTERPRETER)


@functools.cache
def _sandbox_problem(interpreter: str) -> str | None:
    """Whether the watchdog can make its namespaces here: one probe per interpreter and process."""
    if not sys.platform.startswith("linux"):
        return f"code rewards run only on Linux (namespaces, prctl); this is {sys.platform}"
    probe = "import ctypes, os; libc = ctypes.CDLL(None, use_errno=True); " \
            "os._exit(0 if libc.unshare(0x10000000 | 0x40000000 | 0x20000000) == 0 else 125)"
    try:
        done = subprocess.run([interpreter, *_FLAGS, "-c", probe], env=_ENV, stdin=subprocess.DEVNULL,
                              stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL, timeout=30, check=False)
    except (OSError, subprocess.SubprocessError) as error:
        return f"the sandbox's interpreter {interpreter} does not start: {error}"
    if done.returncode != 0:
        return ("this kernel or container refuses new user, network and PID namespaces "
                "(unshare), without which code is not run")
    return None


#: Scores this process has computed, by SHA-256 of everything that decides them (the code, the
#: tests, the limits; the Python is this process's): a trainer scores each record when it
#: generates it, when it verifies it and for its batch's accuracy, and one run of the child
#: serves all three. 4096 is a default step's 16 x 8 records many times over; a digest and a
#: float each, so the memory is bounded too.
SCORES_KEPT = 4096
_scores: OrderedDict[bytes, float] = OrderedDict()
_scores_lock = threading.Lock()


def code_reward(completion: str, tests: str, params: Mapping[str, str | int | float | bool]) -> float:
    """1.0 when the completion's code passes ``tests`` within the limits, else 0.0 (no code,
    code or tests too large, a failing assertion, an exception, a timeout, a limit hit).
    :class:`SandboxUnavailable` when this machine cannot run it as specified."""
    code = extract_code(completion)
    if code is None or len(code.encode("utf-8", "replace")) > MAX_CODE_BYTES \
            or len(tests.encode("utf-8", "replace")) > MAX_TESTS_BYTES:
        return 0.0
    if problem := sandbox_problem():
        raise SandboxUnavailable(problem)
    time_ms, memory_mb = int(params["time_ms"]), int(params["memory_mb"])
    key = hashlib.sha256(repr((code, tests, time_ms, memory_mb)).encode("utf-8", "surrogatepass")).digest()
    with _scores_lock:
        if key in _scores:
            _scores.move_to_end(key)
            return _scores[key]
    score = float(run_tests(code, tests, time_ms, memory_mb))
    with _scores_lock:
        _scores[key] = score
        while len(_scores) > SCORES_KEPT:
            _scores.popitem(last=False)
    return score


def run_tests(code: str, tests: str, time_ms: int, memory_mb: int) -> bool:
    """Whether ``code`` then ``tests`` run to the end in a sandboxed child within the limits.
    What fails here rather than in the child (no temporary directory, no fork, no
    namespaces) is :class:`SandboxUnavailable`, never a score."""
    nonce = secrets.token_hex(16)
    try:
        with tempfile.TemporaryDirectory(prefix="vrl-code-") as work:
            root = Path(work)
            for name, text in (("solution.py", code), ("tests.py", tests)):
                (root / name).write_text(text, encoding="utf-8", errors="replace")
                (root / name).chmod(0o444)
            output = root / "stdout"
            output.touch()
            root.chmod(0o555)  # the code cannot create files beside the ones it was given
            try:
                passed = _run(root, output, nonce, time_ms, memory_mb)
            finally:
                root.chmod(0o755)
    except OSError as error:
        if isinstance(error, SandboxUnavailable):
            raise
        raise SandboxUnavailable(f"code/v1 cannot run here: {type(error).__name__}: {error}") from None
    return passed


def _run(root: Path, output: Path, nonce: str, time_ms: int, memory_mb: int) -> bool:
    limits = (time_ms + START_MS, math.ceil(time_ms / 1000), memory_mb << 20, FILE_BYTES, OPEN_FILES)
    command = [INTERPRETER, *_FLAGS, "-c", _SETUP, *map(str, limits), *_FLAGS, "-c", _RUNNER]
    with output.open("wb") as sink:
        child = subprocess.Popen(command, cwd=root, env=_ENV, stdin=subprocess.PIPE, stdout=sink,
                                 stderr=subprocess.DEVNULL, start_new_session=True, close_fds=True)
        assert child.stdin is not None  # stdin=PIPE
        try:
            try:
                child.stdin.write(nonce.encode() + b"\n")
                child.stdin.close()
            except BrokenPipeError:  # it died before reading: a failure, judged by its status below
                pass
            status = child.wait(timeout=(time_ms + START_MS + WATCHDOG_MS) / 1000)
        except subprocess.TimeoutExpired:
            status = None
        finally:
            try:  # the watchdog and its group; the namespace dies with the watchdog (PDEATHSIG)
                os.killpg(child.pid, signal.SIGKILL)
            except ProcessLookupError:
                pass
            child.wait()
    if status == UNAVAILABLE:
        raise SandboxUnavailable("code/v1 cannot run here: the sandbox could not be made "
                                 "(namespaces, fork or exec refused)")
    if status != 0:
        return False
    with output.open("rb") as read:
        read.seek(max(0, output.stat().st_size - 256))
        tail = read.read().split(b"\n")
    return len(tail) >= 2 and tail[-2] == nonce.encode() and tail[-1] == b""
