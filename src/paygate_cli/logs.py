"""stderr logging: text on a TTY, JSON lines otherwise, `<N>` syslog prefixes under journald.

Every record passes through `secrets.scrub` so a secret that reached a message anyway is masked."""

from __future__ import annotations

import json
import logging
import time
from typing import Any

from paygate_cli.env import Env
from paygate_cli.secrets import scrub

_SYSLOG_PRIORITY = {logging.DEBUG: 7, logging.INFO: 6, logging.WARNING: 4, logging.ERROR: 3, logging.CRITICAL: 2}
_STANDARD_ATTRS = set(vars(logging.makeLogRecord({}))) | {"message", "asctime", "msgid"}


def _extras(record: logging.LogRecord) -> dict[str, Any]:
    return {k: v for k, v in vars(record).items() if k not in _STANDARD_ATTRS and not k.startswith("_")}


class JsonFormatter(logging.Formatter):
    def __init__(self, *, journald: bool) -> None:
        super().__init__()
        self.journald = journald

    def format(self, record: logging.LogRecord) -> str:
        doc: dict[str, Any] = {}
        if not self.journald:  # journald stamps its own time
            doc["ts"] = time.strftime("%Y-%m-%dT%H:%M:%S", time.gmtime(record.created)) + (
                f".{int(record.msecs):03d}Z"
            )
        doc["level"] = record.levelname.lower()
        doc["msgid"] = getattr(record, "msgid", record.name)
        doc["msg"] = record.getMessage()
        doc.update(_extras(record))
        if record.exc_info:
            doc["exc"] = self.formatException(record.exc_info)
        line = scrub(json.dumps(doc, default=str))
        if self.journald:
            return f"<{_SYSLOG_PRIORITY.get(record.levelno, 6)}>{line}"
        return line


class TextFormatter(logging.Formatter):
    def format(self, record: logging.LogRecord) -> str:
        extras = " ".join(f"{k}={v}" for k, v in _extras(record).items())
        line = f"{record.levelname.lower():7} {record.getMessage()}" + (f"  {extras}" if extras else "")
        if record.exc_info:
            line += "\n" + self.formatException(record.exc_info)
        return scrub(line)


def wants_json(env: Env, fmt: str) -> bool:
    return fmt == "json" or (fmt == "auto" and (bool(env.environ.get("JOURNAL_STREAM")) or not env.stderr_isatty))


def configure_logging(env: Env, *, fmt: str = "auto", level: str = "info") -> None:
    logger = logging.getLogger("paygate")
    for handler in list(logger.handlers):
        logger.removeHandler(handler)
    handler = logging.StreamHandler(env.stderr)
    journald = bool(env.environ.get("JOURNAL_STREAM"))
    if wants_json(env, fmt):
        handler.setFormatter(JsonFormatter(journald=journald))
    else:
        handler.setFormatter(TextFormatter())
    logger.addHandler(handler)
    logger.setLevel(level.upper())
    logger.propagate = False


def get_logger(name: str) -> logging.Logger:
    return logging.getLogger(f"paygate.{name}")


def final_line(env: Env, *, fmt: str, level: int, msgid: str, message: str, code: int) -> str:
    """The one line a run ends with when it fails or is skipped, in the same format as its logs:
    `paygate: error: …` on a terminal, a JSON line otherwise, `<N>`-prefixed under journald (so a
    skip is stored at info priority and an error at err)."""
    if not wants_json(env, fmt):
        return f"paygate: {'error' if level >= logging.ERROR else 'skipped'}: {scrub(message)}"
    record = logging.makeLogRecord({"levelno": level, "levelname": logging.getLevelName(level), "msg": message,
                                    "msgid": msgid, "exit_code": code, "name": "paygate.main"})
    return JsonFormatter(journald=bool(env.environ.get("JOURNAL_STREAM"))).format(record)
