"""Reading a configuration file: TOML, checked against the published JSON Schema, with every
problem reported at the line of the file it is about."""

from __future__ import annotations

import json
import re
import tomllib
from dataclasses import dataclass
from functools import cache
from pathlib import Path
from typing import Any

import jsonschema

from ledgerweb.paths import shipped

SCHEMA_FILE = "config.schema.json"
FORMAT_VERSION = 1
_AT_LINE = re.compile(r"\(at line (\d+), column \d+\)")
_HEADER = re.compile(r"^\s*(\[\[?)\s*([^\]]+?)\s*\]\]?\s*(?:#.*)?$")


class ConfigError(Exception):
    """A configuration that cannot be applied. ``problems`` are (line or None, message)."""

    def __init__(self, path: str, problems: list[tuple[int | None, str]]) -> None:
        self.path = path
        self.problems = sorted(problems, key=lambda item: (item[0] or 0, item[1]))
        super().__init__(str(self))

    def __str__(self) -> str:
        return "\n".join(
            f"{self.path}:{line}: {message}" if line else f"{self.path}: {message}"
            for line, message in self.problems
        )


@cache
def schema() -> dict[str, Any]:
    """The published JSON Schema of the file (docs/config.schema.json)."""
    return json.loads((shipped("docs") / SCHEMA_FILE).read_text(encoding="utf-8"))


@dataclass
class Document:
    """A parsed, schema-valid configuration file and the text it came from."""

    path: str
    data: dict[str, Any]
    text: str

    def entries(self, section: str) -> list[dict[str, Any]]:
        return list(self.data.get(section, []))

    def line_of(self, where: tuple[Any, ...]) -> int | None:
        """The line of ``where``: a section name, then an entry index, then a field name."""
        return locate(self.text, where)

    def error(self, where: tuple[Any, ...], message: str) -> tuple[int | None, str]:
        return (self.line_of(where), message)


def read(path: str, text: str | None = None) -> Document:
    """Parse and validate the file at ``path`` (or ``text``); ConfigError names each line."""
    if text is None:
        try:
            text = Path(path).read_text(encoding="utf-8")
        except OSError as exc:
            raise ConfigError(path, [(None, f"cannot read it: {exc.strerror or exc}")]) from None
        except UnicodeDecodeError:
            raise ConfigError(path, [(None, "not UTF-8 text")]) from None
    try:
        data = tomllib.loads(text)
    except tomllib.TOMLDecodeError as exc:
        found = _AT_LINE.search(str(exc))
        message = _AT_LINE.sub("", str(exc)).strip()
        raise ConfigError(
            path, [(int(found.group(1)) if found else None, f"not valid TOML: {message}")]
        ) from None
    document = Document(path=path, data=data, text=text)
    validator = jsonschema.Draft202012Validator(schema())
    problems = [
        document.error(tuple(error.absolute_path), _schema_message(error))
        for error in validator.iter_errors(data)
    ]
    if problems:
        raise ConfigError(path, problems)
    return document


def _schema_message(error: jsonschema.ValidationError) -> str:
    where = ""
    for part in error.absolute_path:
        where += f"[{part}]" if isinstance(part, int) else (f".{part}" if where else part)
    if error.validator == "required" and error.validator_value == ["version"]:
        return f"the file must start with version = {FORMAT_VERSION}"
    return f"{where}: {error.message}" if where else error.message


def locate(text: str, where: tuple[Any, ...]) -> int | None:
    """Find the line a schema path points at in TOML text written with ``[[section]]`` tables
    (as ``dump`` writes) or ``section = [...]`` arrays; None when it cannot be found."""
    if not where:
        return None
    lines = text.splitlines()
    section = str(where[0])
    headers = [
        (number, match.group(1) == "[[", match.group(2).replace('"', "").replace(" ", ""))
        for number, line in enumerate(lines)
        if (match := _HEADER.match(line))
    ]
    assignment = re.compile(rf"^\s*\"?{re.escape(section)}\"?\s*=")
    top_level = next(
        (
            n
            for n, line in enumerate(lines)
            if assignment.match(line) and not _inside_table(n, headers)
        ),
        None,
    )
    if top_level is None:
        top_level = next((n for n, _, name in headers if name == section), None)
    if len(where) == 1 or not isinstance(where[1], int):
        return None if top_level is None else top_level + 1
    starts = [n for n, array, name in headers if array and name == section]
    index = where[1]
    if index >= len(starts):
        return None if top_level is None else top_level + 1
    start = starts[index]
    end = next(
        (
            n
            for n, array, name in headers
            if n > start and (array or not name.startswith(section + "."))
        ),
        len(lines),
    )
    if len(where) >= 3:
        field = str(where[2])
        key = re.compile(rf"^\s*\"?{re.escape(field)}\"?\s*[=.]")
        for number in range(start + 1, end):
            if key.match(lines[number]):
                return number + 1
        for number, _, name in headers:
            if start < number < end and name == f"{section}.{field}":
                return number + 1
    return start + 1


def _inside_table(number: int, headers: list[tuple[int, bool, str]]) -> bool:
    return any(n < number for n, _, _ in headers)
