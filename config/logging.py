"""JSON-lines log formatter (stdlib only).

One JSON object per line with the time, level, logger, message and any of the
identifier fields passed through ``extra=`` (sweep, job, operation, portfolio,
category). Only those whitelisted keys are copied: a stray ``extra`` carrying
record contents never reaches the log.
"""

from __future__ import annotations

import json
import logging
from datetime import UTC, datetime

ID_FIELDS = ("sweep_id", "job_id", "operation_id", "portfolio_id", "property_id", "record_kind", "category", "status")


class JsonLinesFormatter(logging.Formatter):
    def format(self, record: logging.LogRecord) -> str:
        payload: dict[str, object] = {
            "ts": datetime.fromtimestamp(record.created, tz=UTC).isoformat(),
            "level": record.levelname,
            "logger": record.name,
            "message": record.getMessage(),
        }
        for field in ID_FIELDS:
            value = getattr(record, field, None)
            if value is not None:
                payload[field] = value
        if record.exc_info:
            # The exception's class only: its message may quote record data.
            payload["exception"] = record.exc_info[0].__name__ if record.exc_info[0] else None
        return json.dumps(payload, default=str)
