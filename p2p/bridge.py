"""The trio <-> asyncio bridge of the libp2p transport.

py-libp2p runs on trio; the node runs on asyncio. A :class:`TrioBridge` owns a thread that runs
``trio.run``, and carries calls both ways: :meth:`TrioBridge.call` awaits, on the node's loop,
a coroutine function run on the trio thread; :meth:`TrioBridge.in_asyncio` awaits, on the trio
thread, a coroutine run on the node's loop. Cancelling either side cancels the other, and
closing the bridge fails the calls still waiting. It imports nothing of libp2p (its log
and error messages name the libp2p thread, the one it serves).
"""

from __future__ import annotations

import asyncio
import concurrent.futures
import functools
import threading
from collections.abc import Awaitable, Callable, Coroutine
from typing import Any, TypeVar

import trio

from p2p import _common
from p2p.transport import TransportError

T = TypeVar("T")
log = _common.log

# How long close() waits for the network thread: host shutdown measured at well under 1 s.
CLOSE_TIMEOUT = 10.0


class TrioBridge:
    """A thread running trio, and the calls between it and the asyncio loop that started it.

    The trio side is a ``main`` coroutine function (given to :meth:`start`) that sets up
    whatever it serves and then awaits :meth:`serve`, which holds the nursery the bridged calls
    run in until :meth:`stop`. Methods named for a side must be called from that side."""

    def __init__(self, thread_name: str) -> None:
        self._thread_name = thread_name
        # asyncio side; the loop is set by start(), before any call can cross
        self._loop: asyncio.AbstractEventLoop
        self._thread: threading.Thread | None = None
        self._pending: set[asyncio.Future[Any]] = set()
        # trio side, set once the thread runs, before ``main`` (so before the start is done)
        self._ready: concurrent.futures.Future[None]
        self._token: trio.lowlevel.TrioToken
        self._stop: trio.Event
        self.nursery: trio.Nursery | None = None
        """Where the bridged calls run (None until :meth:`serve` opens it): stopping cancels
        them first, and then what ``main`` set up shuts down without being cancelled itself."""

    @property
    def started(self) -> bool:
        """Whether a thread was started and not forgotten after a failed start."""
        return self._thread is not None

    # -- asyncio side --

    def start(self, main: Callable[[], Awaitable[None]]) -> concurrent.futures.Future[None]:
        """Run ``main`` on a new thread under ``trio.run``. The future is done once it is
        serving, or fails with what it failed with (then call :meth:`join`)."""
        self._loop = asyncio.get_running_loop()
        ready: concurrent.futures.Future[None] = concurrent.futures.Future()
        self._thread = threading.Thread(target=self._thread_main, args=(main, ready), daemon=True,
                                        name=self._thread_name)
        self._thread.start()
        return ready

    async def join(self) -> None:
        """After a failed start: wait for the thread to end, and forget it (nothing left to stop).
        Both a failed start and a close that waited on it may ask: the second finds it gone."""
        thread = self._thread
        if thread is not None:
            await asyncio.to_thread(thread.join, CLOSE_TIMEOUT)
        self._thread = None

    async def stop(self) -> None:
        """Stop serving and wait, within CLOSE_TIMEOUT, for the thread to end."""
        self.to_trio(self._stop.set, quiet=True)
        thread = self._thread
        if thread is not None:  # None only once join() has forgotten a thread that failed to start
            await asyncio.to_thread(thread.join, CLOSE_TIMEOUT)

    def fail_calls(self) -> None:
        """After :meth:`stop`: fail the calls still waiting; raise if the thread outlived it."""
        for future in self._pending:
            if not future.done():
                future.set_exception(TransportError("transport closed"))
        if self._thread is not None and self._thread.is_alive():
            raise TransportError(f"the libp2p thread did not stop within {CLOSE_TIMEOUT} s")

    async def call(self, fn: Callable[..., Awaitable[T]], *args: Any) -> T:
        """Run ``fn(*args)`` on the trio thread and await its result here. Cancelling the
        caller cancels the trio side; closing the transport fails the call."""
        loop = asyncio.get_running_loop()
        future: asyncio.Future[T] = loop.create_future()
        scope = trio.CancelScope()

        def settle(result: Any, error: BaseException | None) -> None:
            if not future.done():
                if error is None:
                    future.set_result(result)
                else:
                    future.set_exception(error)

        def report(result: Any = None, error: BaseException | None = None) -> None:
            try:
                loop.call_soon_threadsafe(settle, result, error)
            except RuntimeError:
                pass  # the caller's loop is closed: nobody is waiting

        async def run() -> None:
            try:
                with scope:
                    result = await fn(*args)
                    report(result)
            except TransportError as error:
                report(error=error)
            except Exception as error:
                log.exception("unexpected error on the libp2p thread")
                report(error=TransportError(f"unexpected libp2p error: {error!r}"))
            except BaseException:  # cancelled (perhaps inside a group): we are shutting down
                report(error=TransportError("transport closed"))
                raise

        self._pending.add(future)
        try:
            self.to_trio(functools.partial(self._start_soon, run,
                                           lambda: report(error=TransportError("transport closed"))))
            return await future
        except asyncio.CancelledError:
            self.to_trio(scope.cancel, quiet=True)
            raise
        finally:
            self._pending.discard(future)

    def spawn_in_trio(self, fn: Callable[..., Awaitable[None]], *args: Any) -> None:
        """Fire and forget on the trio thread; failures are logged."""
        async def run() -> None:
            try:
                await fn(*args)
            except Exception:
                log.exception("libp2p background task failed")

        self.to_trio(functools.partial(self._start_soon, run, lambda: None), quiet=True)

    def to_trio(self, fn: Callable[[], None], *, quiet: bool = False) -> None:
        """Run ``fn()`` on the trio thread soon. Once trio has finished: TransportError, or
        nothing if ``quiet``."""
        try:
            self._token.run_sync_soon(fn)
        except trio.RunFinishedError:
            if not quiet:
                raise TransportError("transport closed") from None

    # -- trio side --

    async def serve(self, on_open: Callable[[trio.Nursery], None]) -> None:
        """Called by ``main`` once it is ready: open the nursery of the bridged calls, hand it
        to ``on_open``, report the start done, and hold it until :meth:`stop`."""
        async with trio.open_nursery() as nursery:
            self.nursery = nursery
            on_open(nursery)
            self._ready.set_result(None)
            await self._stop.wait()
            nursery.cancel_scope.cancel()

    def to_asyncio(self, fn: Callable[..., None], *args: Any) -> None:
        """Run ``fn(*args)`` on the node's loop soon."""
        self._loop.call_soon_threadsafe(fn, *args)

    async def in_asyncio(self, coroutine: Coroutine[Any, Any, T]) -> T:
        """Await, on the trio thread, a coroutine run on the node's loop. Cancelling the trio
        side cancels the coroutine."""
        try:
            future = asyncio.run_coroutine_threadsafe(coroutine, self._loop)
        except RuntimeError:  # the node's loop is closed
            coroutine.close()
            raise
        done = trio.Event()
        token = trio.lowlevel.current_trio_token()

        def wake(_: concurrent.futures.Future[T]) -> None:
            try:
                token.run_sync_soon(done.set)
            except trio.RunFinishedError:
                pass  # trio has finished: nothing waits for the wake-up any more

        future.add_done_callback(wake)
        try:
            await done.wait()
        except BaseException:
            future.cancel()
            raise
        return future.result()

    def _start_soon(self, task: Callable[[], Awaitable[None]], if_closed: Callable[[], None]) -> None:
        """On the trio thread: start ``task`` in our nursery. An exception here would crash
        trio.run (it is a run_sync_soon callback), so a closed nursery calls ``if_closed``."""
        # Bridged calls are made once the start is done, and serve() opened the nursery before that.
        assert self.nursery is not None
        try:
            self.nursery.start_soon(task)
        except RuntimeError:  # the nursery is closed: we are shutting down
            if_closed()

    # -- the thread --

    def _thread_main(self, main: Callable[[], Awaitable[None]], ready: concurrent.futures.Future[None]) -> None:
        try:
            trio.run(self._trio_main, main, ready)
        except BaseException as error:
            if not ready.done():
                ready.set_exception(error)
            else:
                log.exception("libp2p thread ended with an error")

    async def _trio_main(self, main: Callable[[], Awaitable[None]], ready: concurrent.futures.Future[None]) -> None:
        self._ready = ready
        self._token = trio.lowlevel.current_trio_token()
        self._stop = trio.Event()
        await main()
