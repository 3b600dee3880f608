"""Atomic file writes (a reader sees the old file or the new one, never half of one), and reading back the
JSON-lines logs that notebooks append to."""
from __future__ import annotations

import json
import os
import uuid
from pathlib import Path


def write_text_atomic(text: str, path: str | os.PathLike) -> Path:
    """Write `text` to a uniquely named temporary file beside `path`, then rename it over `path`
    (so parallel writers never share a temporary file). Creates missing parent folders."""
    path = Path(path)
    path.parent.mkdir(parents=True, exist_ok=True)
    tmp = path.with_name(f".{path.name}.{uuid.uuid4().hex[:8]}.tmp")
    tmp.write_text(text)
    os.replace(tmp, path)
    return path


def read_json_lines(path: str | os.PathLike) -> list:
    """The records of a JSON-lines file, one per non-empty line; [] when there is no file."""
    path = Path(path)
    return [json.loads(line) for line in path.read_text().splitlines() if line.strip()] if path.exists() else []
