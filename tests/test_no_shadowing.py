"""No repository folder reaches `sys.path` holding a module named like an installed distribution.

Why: `fpga/scripts/kernels.py` once sat on `sys.path` (put there by a test) and shadowed the `kernels`
package that transformers 5 imports, so a fresh machine failed 238 tests while an older one passed. A folder
reaches `sys.path` in three ways: a file calls `sys.path.insert`/`append` on it, it holds a script (a file
with a `__main__` block), whose own folder Python puts first when it runs, or a Makefile runs
`cd DIR && $(PYTHON) -c ...` there (the current folder comes first for `-c`). For each such folder this test
lists the modules it holds (`*.py` files and folders with `__init__.py`) and fails on any whose name is a
top-level module of an installed distribution other than dfvg itself, or of the standard library.
"""

from __future__ import annotations

import ast
import re
import sys
from importlib.metadata import packages_distributions
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
SKIP_DIRS = {".git", ".venv", "models", "results", "build", "sim_build", "__pycache__", ".whl", ".chunks"}


def repository_python_files() -> list[Path]:
    return [p for p in ROOT.rglob("*.py") if not SKIP_DIRS & set(p.relative_to(ROOT).parts)]


def _is_sys_path_call(node: ast.AST) -> bool:
    return (isinstance(node, ast.Call) and isinstance(node.func, ast.Attribute)
            and node.func.attr in {"insert", "append"} and ast.unparse(node.func.value) == "sys.path")


def _evaluate(expression: ast.expr, namespace: dict) -> Path:
    value = eval(compile(ast.Expression(expression), "<sys.path argument>", "eval"), namespace)  # noqa: S307
    path = Path(str(value))
    return path if path.is_absolute() else ROOT / path  # relative paths are meant from the repository root


def _constants(tree: ast.Module, path: Path) -> dict:
    """The file's top-level path constants (ROOT = Path(__file__).parents[1], ...), evaluated in order."""
    namespace: dict = {"Path": Path, "__file__": str(path), "str": str}
    for node in tree.body:
        if isinstance(node, ast.Assign):
            try:
                exec(compile(ast.Module([node], []), str(path), "exec"), namespace)  # noqa: S102
            except Exception:  # noqa: BLE001 - only path arithmetic matters here; other constants are skipped
                pass
    return namespace


def folders_put_on_sys_path(path: Path) -> set[Path]:
    """Folders that running or importing `path` puts on sys.path."""
    source = path.read_text()
    tree = ast.parse(source)
    folders = {path.parent} if "__main__" in source else set()
    calls = [node for node in ast.walk(tree) if _is_sys_path_call(node)]
    if calls:
        namespace = _constants(tree, path)
        for call in calls:
            folders.add(_evaluate(call.args[-1], namespace).resolve())
    return folders


MAKE_PYTHON_C = re.compile(r"cd (\S+) && \$\(PYTHON\) -c")


def folders_of_makefiles() -> dict[Path, set[Path]]:
    """Makefile -> the folders its `cd DIR && $(PYTHON) -c` commands run Python in."""
    found = {}
    for makefile in ROOT.rglob("Makefile"):
        if not SKIP_DIRS & set(makefile.relative_to(ROOT).parts):
            found[makefile] = {(makefile.parent / d).resolve() for d in MAKE_PYTHON_C.findall(makefile.read_text())}
    return found


def modules_in(folder: Path) -> set[str]:
    files = {p.stem for p in folder.glob("*.py")}
    packages = {p.parent.name for p in folder.glob("*/__init__.py")}
    return files | packages


def shadowed_names() -> dict[str, str]:
    """Top-level import name -> who owns it, for every installed distribution but dfvg, and the stdlib."""
    owners = {name: "the standard library" for name in sys.stdlib_module_names}
    for name, distributions in packages_distributions().items():
        if "dfvg" not in distributions:
            owners[name] = "installed distribution " + ", ".join(distributions)
    return owners


def test_the_scan_sees_sys_path_calls_and_script_folders(tmp_path):
    """The scanner itself can fail: a script beside a `json.py` and a sys.path call are both found."""
    script = tmp_path / "tool.py"
    script.write_text("import sys\nfrom pathlib import Path\nHERE = Path(__file__).resolve().parent\n"
                      "sys.path.insert(0, str(HERE / 'lib'))\nif __name__ == '__main__':\n    pass\n")
    (tmp_path / "json.py").write_text("")
    folders = folders_put_on_sys_path(script)
    assert folders == {tmp_path, (tmp_path / "lib").resolve()}
    assert "json" in modules_in(tmp_path) & set(shadowed_names())
    assert MAKE_PYTHON_C.findall("X := $(shell cd scripts && $(PYTHON) -c 'import k')") == ["scripts"]


def test_no_repository_folder_on_sys_path_shadows_an_installed_module():
    owners = shadowed_names()
    clashes = []
    places = {path: folders_put_on_sys_path(path) for path in repository_python_files()} | folders_of_makefiles()
    for path, folders in places.items():
        for folder in folders:
            for name in sorted(modules_in(folder) & set(owners)):
                clashes.append(f"{path.relative_to(ROOT)} puts {folder} on sys.path; its {name!r} shadows "
                               f"{owners[name]}: rename it")
    assert not clashes, "\n".join(clashes)
