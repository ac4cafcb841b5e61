"""Chat templates: turning one user prompt into the text an instruct checkpoint was trained to see.

An instruct model fed a bare prompt continues it as a document (the Qwen coder answers HumanEval's raw
prompt with `doctest.testmod()`); wrapped in its chat template it answers the request. The template is the
checkpoint's own Jinja text, found where Hugging Face looks for it: `chat_template.jinja` next to the
weights (which wins, as in HF), else `chat_template` in `tokenizer_config.json`. It is rendered as HF's
`apply_chat_template` renders it: a sandboxed Jinja environment with `trim_blocks` / `lstrip_blocks`,
`raise_exception`, `strftime_now`, a `tojson` that does not escape HTML, the special tokens (`bos_token`,
`eos_token`, ...) as variables, `messages=[{"role": "user", "content": prompt}]` and
`add_generation_prompt=True`.

Owns: finding, checking and rendering a template. Does not own: the wording of a prompt (the caller's text
is the user message verbatim; see `dfvg.datasets.humaneval_instruction` for the demo's), tokenization
(`dfvg.tokenizer`), or applying templates in experiments (those keep raw prompts).
"""

from __future__ import annotations

import json
from dataclasses import dataclass
from datetime import datetime
from pathlib import Path

import jinja2
from jinja2.ext import Extension, loopcontrols
from jinja2.sandbox import ImmutableSandboxedEnvironment

from dfvg.checkpoint import checkpoint_dir, read_json
from dfvg.errors import UserError

TEMPLATE_FILE = "chat_template.jinja"
CONFIG_FILE = "tokenizer_config.json"
SPECIAL_TOKENS = ("bos_token", "eos_token", "unk_token", "sep_token", "pad_token", "cls_token", "mask_token")
_FIX = "fix the template or pass --raw-prompt to send the prompt as plain text"


@dataclass(frozen=True)
class ChatTemplate:
    """A checkpoint's template text, the file it came from (for error messages) and its special tokens."""

    source: str
    file: Path
    special_tokens: dict[str, str]


def find_chat_template(path: str | Path) -> ChatTemplate | None:
    """The checkpoint's chat template, or None when it has none (a base model: prompts stay raw text)."""
    directory = checkpoint_dir(path)
    config_file = directory / CONFIG_FILE
    config = read_json(config_file, CONFIG_FILE) if config_file.is_file() else {}
    special = _special_tokens(directory, config)
    jinja_file = directory / TEMPLATE_FILE
    if jinja_file.is_file():
        return ChatTemplate(jinja_file.read_text(encoding="utf-8"), jinja_file, special)
    source = _default_template(config.get("chat_template"), config_file)
    return ChatTemplate(source, config_file, special) if source is not None else None


def _default_template(value, config_file: Path) -> str | None:
    """`chat_template` is a string, or (older HF files) a list of named templates of which "default" is used."""
    if value is None or isinstance(value, str):
        return value or None
    if isinstance(value, list):
        named = {t.get("name"): t.get("template") for t in value if isinstance(t, dict)}
        if isinstance(named.get("default"), str):
            return named["default"]
    raise UserError(f"{config_file}: chat_template must be a string or a list with a template named 'default'; "
                    f"{_FIX}")


def _special_tokens(directory: Path, config: dict) -> dict[str, str]:
    """Special-token strings the template may use (`{{ bos_token }}`): tokenizer_config.json, then the
    older special_tokens_map.json. Values are strings or `{"content": ...}` dicts (AddedToken)."""
    sources = [config]
    legacy = directory / "special_tokens_map.json"
    if legacy.is_file():
        sources.append(read_json(legacy, legacy.name))
    tokens: dict[str, str] = {}
    for name in SPECIAL_TOKENS:
        for source in sources:
            value = source.get(name)
            value = value.get("content") if isinstance(value, dict) else value
            if isinstance(value, str):
                tokens[name] = value
                break
    return tokens


class _GenerationTag(Extension):
    """HF's `{% generation %}...{% endgeneration %}` (it marks assistant tokens for training masks); here the
    block just renders its body, so templates that use it still parse."""

    tags = {"generation"}

    def parse(self, parser):
        lineno = next(parser.stream).lineno
        body = parser.parse_statements(("name:endgeneration",), drop_needle=True)
        return jinja2.nodes.CallBlock(self.call_method("_body"), [], [], body).set_lineno(lineno)

    def _body(self, caller) -> str:
        return caller()


def _raise_exception(message: str):
    raise jinja2.exceptions.TemplateError(message)


def _tojson(value, ensure_ascii=False, indent=None, separators=None, sort_keys=False) -> str:
    return json.dumps(value, ensure_ascii=ensure_ascii, indent=indent, separators=separators, sort_keys=sort_keys)


def _environment() -> ImmutableSandboxedEnvironment:
    """The environment HF compiles chat templates in (templates are untrusted code: sandboxed)."""
    env = ImmutableSandboxedEnvironment(trim_blocks=True, lstrip_blocks=True,
                                        extensions=[_GenerationTag, loopcontrols])
    env.filters["tojson"] = _tojson
    env.globals["raise_exception"] = _raise_exception
    env.globals["strftime_now"] = lambda fmt: datetime.now().strftime(fmt)
    return env


def render_chat(template: ChatTemplate, prompt: str) -> str:
    """The text of a one-turn conversation whose user message is `prompt`, ending where the assistant's
    answer starts. A template that does not parse or fails while rendering is a one-line `UserError`."""
    try:
        compiled = _environment().from_string(template.source)
        return compiled.render(messages=[{"role": "user", "content": prompt}], add_generation_prompt=True,
                               **template.special_tokens)
    except jinja2.TemplateSyntaxError as err:
        raise UserError(f"{template.file}: chat template line {err.lineno} is not valid Jinja "
                        f"({_one_line(err.message)}); {_FIX}") from None
    except (jinja2.TemplateError, TypeError, ValueError) as err:  # raise_exception(), or bad operations
        raise UserError(f"{template.file}: chat template failed to render ({_one_line(str(err))}); "
                        f"{_FIX}") from None


def _one_line(message: str | None) -> str:
    return " ".join((message or "no message").split())
