"""Reading a YAML config file: the one reader behind experiment configs, device configs and model registries.

Owns the refusals a user can fix (missing file, YAML syntax error with its line, a document that is not a
mapping), each in one line. What the keys mean is the caller's business.
"""

from __future__ import annotations

from pathlib import Path

import yaml

from dfvg.errors import UserError


def read_yaml(path: Path, what: str = "config") -> dict:
    """A YAML mapping from a file ({} for an empty file), or one line saying why not."""
    if not path.is_file():
        raise UserError(f"{what} file not found: {path}")
    try:
        data = yaml.safe_load(path.read_text())
    except yaml.YAMLError as err:
        mark = getattr(err, "problem_mark", None)
        where = f" at line {mark.line + 1}" if mark else ""
        raise UserError(f"{path} is not valid YAML{where}: {getattr(err, 'problem', err)}") from None
    if data is None:
        return {}
    if not isinstance(data, dict):
        raise UserError(f"{path} must hold a YAML mapping of key: value, got a {type(data).__name__}")
    return data
