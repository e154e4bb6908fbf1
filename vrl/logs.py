"""Logging, as every entry point sets it up: structlog's lines and every library's records on
stderr, JSON or for a terminal. The CLI (vrl.cli) and the harness's scripts (``python -m
vrl.harness.demo``) call :func:`configure_logging` alike; it sits below both.

Nothing heavy is imported at module level (``vrl --help`` starts without torch or
transformers): transformers' logging is set when :func:`configure_logging` runs."""

from __future__ import annotations

import logging
import sys
from typing import TextIO

import structlog
from rich.console import Console


class StderrHandler(logging.StreamHandler[TextIO]):
    """A handler writing to whatever ``sys.stderr`` is when a record comes (as structlog's
    loggers below do): a redirected or replaced stderr must not leave it writing to a closed file."""

    @property
    def stream(self) -> TextIO:
        return sys.stderr

    @stream.setter
    def stream(self, _value: TextIO) -> None:
        pass  # StreamHandler.__init__ sets one; the current stderr is always the one


def configure_logging(json_mode: bool, level: int | None = None) -> None:
    """structlog's lines on stderr, JSON with ``json_mode``, from ``level`` (INFO, or WARNING
    in JSON mode) up; and every standard-library record (py-libp2p's, transformers', any
    library's) rendered by the same processors, so that in JSON mode each stderr line is JSON."""
    level = level if level is not None else logging.WARNING if json_mode else logging.INFO
    renderer = (structlog.processors.JSONRenderer() if json_mode
                else structlog.dev.ConsoleRenderer(colors=Console(stderr=True).is_terminal))
    shared: list[structlog.typing.Processor] = [structlog.processors.add_log_level,
                                                structlog.processors.TimeStamper(fmt="iso")]
    structlog.configure(
        processors=[*shared, renderer],
        # Resolve sys.stderr per logger, not once: a redirected or replaced stderr (tests, daemons)
        # must not leave loggers writing to a closed file.
        logger_factory=lambda *_: structlog.PrintLogger(file=sys.stderr),
        wrapper_class=structlog.make_filtering_bound_logger(level),
    )
    handler = StderrHandler()
    handler.setLevel(level)
    handler.setFormatter(structlog.stdlib.ProcessorFormatter(
        # A foreign record's level, time and logger name, then its traceback as text in JSON
        # (the console renderer draws exc_info itself).
        foreign_pre_chain=[*shared, structlog.stdlib.add_logger_name,
                           *([structlog.processors.format_exc_info] if json_mode else [])],
        processors=[structlog.stdlib.ProcessorFormatter.remove_processors_meta, renderer]))
    root = logging.getLogger()
    for old in [h for h in root.handlers if isinstance(h, StderrHandler)]:  # a second call replaces the first
        root.removeHandler(old)
    root.addHandler(handler)
    # py-libp2p, when imported without LIBP2P_DEBUG, cuts its "libp2p" logger off (propagate
    # off, no handler): its warnings then reach only logging's handler of last resort, which
    # printed them as bare text among the JSON lines. That handler is this one now. (With
    # LIBP2P_DEBUG set, libp2p logs through handlers of its own, to stderr and a file, as asked.)
    logging.lastResort = handler
    logging.getLogger("transformers").setLevel(logging.ERROR)
    from transformers.utils import logging as hf_logging

    hf_logging.set_verbosity_error()
    hf_logging.disable_progress_bar()
    hf_logging.disable_default_handler()  # its errors through the root's handler, as every library's
    hf_logging.enable_propagation()
