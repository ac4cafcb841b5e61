"""`dfvg generate` formats --prompt with the checkpoint's chat template as Hugging Face does, and prints text
plus one stats line. transformers' own `apply_chat_template` on the same files is the reference."""

from __future__ import annotations

import json
import re
import shutil
import subprocess
import sys
from pathlib import Path

import pytest
from tokenizers import processors

from dfvg.chat import ChatTemplate, find_chat_template, render_chat
from dfvg.cli import main
from dfvg.datasets import humaneval_instruction
from tests.conftest import build_tokenizer

# Newlines after block tags and indented tags exercise trim_blocks / lstrip_blocks; the role check
# exercises raise_exception. bos_token / eos_token come from tokenizer_config.json.
TEMPLATE = """{{ bos_token }}
{% for message in messages %}
    {% if message['role'] not in ['user', 'assistant'] %}{{ raise_exception('roles: user, assistant') }}{% endif %}
w10 {{ 'w11' if message['role'] == 'user' else 'w12' }}
{{ message['content'] }} {{ eos_token }}
{% endfor %}
{% if add_generation_prompt %}
w13
{% endif %}"""
EOS_ADDED_TOKEN = {"__type": "AddedToken", "content": "<eos>", "lstrip": False, "normalized": False,
                   "rstrip": False, "single_word": False, "special": True}  # older HF files write this form
CHAT_IDS = [3, 10, 11, 5, 6, 1, 13]  # w3 (BOS, once) w10 w11 | w5 w6 | <eos> w13
STATS = re.compile(r"^\[dfvg\] \d+ new tokens \| [\d.]+ tok/s \| acceptance rate (\d\.\d{3}|n/a \(no draft\)) \| "
                   r"mean accepted length [\d.]+ \(bonus counted\) \| \d+ verify steps$")


def with_template(root: Path, tiny_target: Path, name: str, template: str | None, jinja_file: bool = False) -> Path:
    """A copy of the tiny target whose tokenizer adds BOS (w3) itself and whose config names BOS/EOS and
    (optionally) a chat template, in tokenizer_config.json or in chat_template.jinja."""
    directory = root / name
    shutil.copytree(tiny_target, directory)
    tokenizer = build_tokenizer()
    tokenizer.post_processor = processors.TemplateProcessing(single="w3 $A", special_tokens=[("w3", 3)])
    tokenizer.save(str(directory / "tokenizer.json"))
    config = {"tokenizer_class": "PreTrainedTokenizerFast", "bos_token": "w3", "eos_token": EOS_ADDED_TOKEN}
    if template is not None and jinja_file:
        (directory / "chat_template.jinja").write_text(template)
        config["chat_template"] = "{{ raise_exception('the .jinja file must win') }}"
    elif template is not None:
        config["chat_template"] = template
    (directory / "tokenizer_config.json").write_text(json.dumps(config))
    return directory


@pytest.fixture(scope="module")
def templated(tmp_path_factory, tiny_pair) -> dict[str, Path]:
    root = tmp_path_factory.mktemp("chat")
    target = tiny_pair[0]
    return {
        "config": with_template(root, target, "config", TEMPLATE),
        "jinja": with_template(root, target, "jinja", TEMPLATE, jinja_file=True),
        "none": with_template(root, target, "none", None),
        "syntax": with_template(root, target, "syntax", "{% for m in messages %}{{ m['content'] }}"),
        "raises": with_template(root, target, "raises", "{{ raise_exception('system prompt required') }}"),
    }


def generate_json(capsys, target: Path, *extra: str) -> dict:
    args = ["generate", "--target", str(target), "--prompt", "w5 w6", "--max-new-tokens", "6", "--json", *extra]
    assert main(args) == 0
    return json.loads(capsys.readouterr().out)


def hf_reference(directory: Path, prompt: str) -> tuple[str, list[int]]:
    """(text, ids) of transformers' apply_chat_template on the same tokenizer files. The fast class is named:
    AutoTokenizer would follow config.json's model_type to Qwen2Tokenizer and rebuild a BPE from the vocab."""
    from transformers import PreTrainedTokenizerFast

    tokenizer = PreTrainedTokenizerFast.from_pretrained(str(directory))
    messages = [{"role": "user", "content": prompt}]
    text = tokenizer.apply_chat_template(messages, add_generation_prompt=True, tokenize=False)
    ids = tokenizer.apply_chat_template(messages, add_generation_prompt=True)
    return text, list(ids["input_ids"] if hasattr(ids, "keys") else ids)  # transformers 5 returns a dict


@pytest.mark.parametrize("where", ["config", "jinja"])
def test_prompt_ids_are_the_rendered_template(where, templated, tiny_pair, capsys):
    out = generate_json(capsys, templated[where], "--draft", str(tiny_pair[1]))
    text, ids = hf_reference(templated[where], "w5 w6")
    assert render_chat(find_chat_template(templated[where]), "w5 w6") == text == "w3\nw10 w11\nw5 w6 <eos>\nw13\n"
    assert out["prompt_tokens"] == ids == CHAT_IDS
    assert out["chat_template"] is True


def test_raw_prompt_and_no_template_use_the_text(templated, tiny_pair, capsys):
    raw = generate_json(capsys, templated["config"], "--no-draft", "--raw-prompt")
    assert raw["prompt_tokens"] == [3, 5, 6] and raw["chat_template"] is False  # the post-processor's BOS
    none = generate_json(capsys, templated["none"], "--no-draft")
    assert none["prompt_tokens"] == [3, 5, 6] and none["chat_template"] is False
    assert find_chat_template(tiny_pair[0]) is None  # no tokenizer_config.json at all


def test_prompt_ids_bypass_the_template(templated, capsys):
    args = ["generate", "--target", str(templated["config"]), "--no-draft", "--prompt-ids", "7,8", "--json"]
    assert main(args) == 0
    out = json.loads(capsys.readouterr().out)
    assert out["prompt_tokens"] == [7, 8] and out["chat_template"] is False


@pytest.mark.parametrize("case, expected", [("syntax", "is not valid Jinja"), ("raises", "system prompt required")])
def test_broken_template_is_one_line_exit_2(case, expected, templated):
    proc = subprocess.run([sys.executable, "-m", "dfvg", "generate", "--target", str(templated[case]), "--no-draft",
                           "--prompt", "w5"], capture_output=True, text=True, timeout=120)
    assert proc.returncode == 2 and proc.stdout == ""
    assert proc.stderr.count("\n") == 1 and proc.stderr.startswith("error: "), proc.stderr
    assert "Traceback" not in proc.stderr
    assert expected in proc.stderr and "tokenizer_config.json" in proc.stderr and "--raw-prompt" in proc.stderr
    ok = subprocess.run([sys.executable, "-m", "dfvg", "generate", "--target", str(templated[case]), "--no-draft",
                         "--prompt", "w5", "--raw-prompt", "--max-new-tokens", "2"], capture_output=True, timeout=120)
    assert ok.returncode == 0, ok.stderr


def test_text_then_one_stats_line(templated, tiny_pair, capsys):
    base = ["generate", "--target", str(templated["config"]), "--draft", str(tiny_pair[1]), "--prompt", "w5 w6",
            "--max-new-tokens", "9", "--draft-length", "3"]
    assert main([*base, "--json"]) == 0
    payload = json.loads(capsys.readouterr().out)
    proc = subprocess.run([sys.executable, "-m", "dfvg", *base], capture_output=True, text=True, timeout=120)
    assert proc.returncode == 0, proc.stderr
    assert proc.stdout == payload["text"] + "\n"  # stdout is the text alone: `> file` keeps just the answer
    (line,) = proc.stderr.splitlines()
    match = STATS.match(line)
    assert match, line
    stats = payload["stats"]
    assert f"{stats['num_new_tokens']} new tokens" in line and f"{stats['num_verify_steps']} verify steps" in line
    assert match.group(1) == f"{stats['acceptance_rate']:.3f}"
    merged = subprocess.run([sys.executable, "-m", "dfvg", *base], stdout=subprocess.PIPE,
                            stderr=subprocess.STDOUT, text=True, timeout=120)
    text, stats_line = merged.stdout.rsplit("\n", 2)[:2]
    assert text == payload["text"] and STATS.match(stats_line)  # the text first, then the stats


def test_no_draft_stats_line_says_so(templated, capsys):
    assert main(["generate", "--target", str(templated["none"]), "--no-draft", "--prompt", "w5",
                 "--max-new-tokens", "3"]) == 0
    out = capsys.readouterr()
    assert STATS.match(out.err.strip()) and "n/a (no draft)" in out.err and out.out.count("\n") == 1


def test_hf_template_extras_render():
    """`{% generation %}` (HF's training-mask tag), `tojson` without HTML escaping, loop controls."""
    source = ("{% for m in messages %}{% if m['role'] != 'user' %}{% continue %}{% endif %}{% generation %}"
              "{{ m | tojson }}{% endgeneration %}{% endfor %}")
    text = render_chat(ChatTemplate(source, Path("t.jinja"), {}), "a<b>&")
    assert json.loads(text) == {"role": "user", "content": "a<b>&"} and "<b>" in text


def test_humaneval_instruction_keeps_the_code_verbatim():
    prompt = 'def f(x):\n    """ Return x. """\n'
    message = humaneval_instruction(prompt)
    assert message.startswith("Complete the following Python function.")
    assert message.endswith(f"```python\n{prompt}```")
