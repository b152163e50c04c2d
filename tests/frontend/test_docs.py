"""The docs say only what exists: every file path, command and Python name that README.md and
docs/*.md mention is checked against the tree, and every whole kernel they show compiles.

What is checked, in inline code spans and fenced blocks (and in links):
- links `[text](target)`: the file exists (relative to the page) and a `#fragment` names one
  of its headings;
- paths under samples/, ptxdsl/, bench/, tests/, grammar/ and docs/ exist, relative to the
  repository root (a path that a command writes, after `-o`, `--out`, `--output`, `--out-dir`
  or `--json`, and a pattern such as `ptxdsl/kernels/<name>.ptxdsl` or `docs/img/*.png`, are
  not mentions of a file);
- `ptxdsl.a.b` names import or resolve as attributes, and `from ptxdsl.x import A, B` names
  each exist (in a module that needs torch where torch is absent: the module's file defines
  the name);
- `ptxdsl SUBCOMMAND --flag ...` commands use subcommands and options of the `ptxdsl` parser,
  `python -m bench WORKLOAD --flag ...` workloads and options of the bench parser, and
  `python -m bench.MODULE` a module that exists (UPPER-case words and `<...>` are
  placeholders).

Fenced blocks carry a language: ```ptxdsl is a whole kernel, and must compile with
`ptxdsl.compile` (the verifier included); a partial kernel, an excerpt with `...` or a syntax
sketch is marked ```ptxdsl-fragment and is not compiled. Other blocks are ```python, ```sh or
```text. README.md stays a front page: at most 450 lines, linking every docs page."""

from __future__ import annotations

import ast
import importlib
import re
import sys
from pathlib import Path

import pytest
from conftest import ROOT

import ptxdsl

PAGES = [ROOT / "README.md", *sorted((ROOT / "docs").glob("*.md"))]
LANGUAGES = {"ptxdsl", "ptxdsl-fragment", "python", "sh", "text"}
PATH_ROOTS = ("samples", "ptxdsl", "bench", "tests", "grammar", "docs")
OUTPUT_FLAGS = {"-o", "--out", "--output", "--out-dir", "--json"}

FENCE = re.compile(r"^```([\w-]*)\n(.*?)^```\s*$", re.M | re.S)
SPAN = re.compile(r"``(.+?)``|`([^`]+)`")
LINK = re.compile(r"\[[^\]]*\]\(([^)\s]+)\)")
PATH = re.compile(r"(?<![\w./~$-])((?:" + "|".join(PATH_ROOTS) + r")/[\w./-]*)([*<]?)")
NAME = re.compile(r"(?<![\w./-])ptxdsl(?:\.\w+)+")
FROM = re.compile(r"\bfrom[ \t]+(ptxdsl[\w.]*)[ \t]+import[ \t]+(?:\(([\w\s,]+)\)|([\w ,]+))")
ENV = re.compile(r"^[A-Z_]+=\S*$")


def blocks(text: str) -> list[tuple[str, str]]:
    """(language, body) of every fenced block."""
    return [(m.group(1), m.group(2)) for m in FENCE.finditer(text)]


def code(text: str) -> list[str]:
    """The code a page shows, blocks other than ptxdsl kernels and inline spans (a span
    may wrap over lines), each as one string."""
    prose = FENCE.sub("", text)
    spans = [a or b for a, b in SPAN.findall(" ".join(prose.split()))]
    return [body for lang, body in blocks(text) if not lang.startswith("ptxdsl")] + spans


def slug(heading: str) -> str:
    """The anchor GitHub gives a heading."""
    return re.sub(r"[^\w\- ]", "", heading.strip().lower()).replace(" ", "-")


def anchors(page: Path) -> set[str]:
    text = FENCE.sub("", page.read_text())
    return {slug(m.group(1)) for m in re.finditer(r"^#+ (.+)$", text, re.M)}


def link_problems(page: Path, text: str) -> list[str]:
    out = []
    for target in LINK.findall(SPAN.sub("", FENCE.sub("", text))):
        if target.startswith(("http://", "https://", "mailto:")):
            continue
        file, _, frag = target.partition("#")
        dest = (page.parent / file).resolve() if file else page
        if not dest.exists():
            out.append(f"link to {target}: no such file")
        elif frag and dest.suffix == ".md" and frag not in anchors(dest):
            out.append(f"link to {target}: no heading '#{frag}' in {dest.name}")
    return out


def outputs(snippet: str) -> set[str]:
    """Paths a command in the snippet writes (the arguments of -o, --out, --json, ...)."""
    words = snippet.replace("=", " ").split()
    return {b for a, b in zip(words, words[1:], strict=False) if a in OUTPUT_FLAGS}


def path_problems(snippet: str) -> list[str]:
    written = outputs(snippet)
    out = []
    for m in PATH.finditer(snippet):
        path, pattern = m.group(1).rstrip("."), m.group(2)
        if pattern or path in written or path.rstrip("/") in written:
            continue
        if not (ROOT / path).exists():
            out.append(f"path {path}: does not exist")
    return out


def module_file(module: str) -> Path | None:
    """The source file of ptxdsl module `module`, or None."""
    base = ROOT / Path(*module.split("."))
    file = base / "__init__.py" if base.is_dir() else base.with_suffix(".py")
    return file if file.exists() else None


def defines(module: str, name: str) -> bool:
    """Whether the source of `module` defines `name` at top level (or has it as a submodule)."""
    file = module_file(module)
    if file is None:
        return False
    if module_file(f"{module}.{name}") is not None:
        return True
    found: set[str] = set()
    for node in ast.parse(file.read_text()).body:
        if isinstance(node, ast.FunctionDef | ast.AsyncFunctionDef | ast.ClassDef):
            found.add(node.name)
        elif isinstance(node, ast.Assign | ast.AnnAssign):
            targets = node.targets if isinstance(node, ast.Assign) else [node.target]
            found |= {t.id for t in targets if isinstance(t, ast.Name)}
        elif isinstance(node, ast.ImportFrom | ast.Import):
            found |= {(a.asname or a.name).split(".")[0] for a in node.names}
    return name in found


def read_only(parts: list[str]) -> str | None:
    """`resolve` from the sources, for a module that needs what is not installed (torch):
    the deepest module file named, then the name after it defined there."""
    j = max((j for j in range(1, len(parts) + 1) if module_file(".".join(parts[:j]))),
            default=0)
    if j == len(parts):
        return None
    module = ".".join(parts[:j])
    return None if j and defines(module, parts[j]) else \
        f"{'.'.join(parts)}: {module or 'nothing'} defines no {parts[j]}"


def resolve(dotted: str) -> str | None:
    """None if `dotted` (ptxdsl.a.b...) names a module or an attribute; else why not."""
    parts = dotted.split(".")
    for i in range(len(parts), 0, -1):
        try:
            obj = importlib.import_module(".".join(parts[:i]))
        except ModuleNotFoundError as e:
            if e.name and not e.name.startswith("ptxdsl"):  # an optional dependency: torch
                return read_only(parts)
            continue
        for attr in parts[i:]:
            if not hasattr(obj, attr):
                return f"{dotted}: {'.'.join(parts[:i])} has no {attr}"
            obj = getattr(obj, attr)
        return None
    return f"{dotted}: no module {parts[0]}"


def name_problems(snippet: str) -> list[str]:
    names = set(NAME.findall(snippet))
    for module, *imported in FROM.findall(snippet):
        for item in "".join(imported).split(","):
            word = item.split(" as ")[0].strip()
            if word:
                names.add(f"{module}.{word}")
    return [p for n in sorted(names) if (p := resolve(n)) is not None]


def words(args: str) -> list[str]:
    return args.replace("[", " ").replace("]", " ").replace("|", " ").split()


def placeholder(word: str) -> bool:
    return word.startswith("<") or word.isupper()


def subparsers(parser) -> dict:
    import argparse

    (action,) = [a for a in parser._actions if isinstance(a, argparse._SubParsersAction)]
    return action.choices


def commands(snippet: str) -> list[list[str]]:
    """The words of each shell command in a snippet (split at lines, `&&`, `;` and `|`; a
    `# comment` and leading VAR=value words dropped)."""
    out = []
    for line in snippet.splitlines():
        for cmd in re.split(r"&&|;|\|(?=\s)", line.split(" #")[0]):
            ws = words(cmd)
            while ws and ENV.match(ws[0]):
                ws = ws[1:]
            if ws:
                out.append(ws)
    return out


def command_problems(snippet: str) -> list[str]:
    from bench.__main__ import parser as bench_parser
    from ptxdsl.tools.cli import _parser

    out = []
    for ws in commands(snippet):
        if Path(ws[0]).name == "ptxdsl":
            prog, choices, args = "ptxdsl", subparsers(_parser()), ws[1:]
        elif Path(ws[0]).name.startswith("python") and ws[1:3] == ["-m", "bench"]:
            prog, choices, args = "python -m bench", subparsers(bench_parser()), ws[3:]
        else:
            module = ws[2] if ws[1:2] == ["-m"] and len(ws) > 2 else ""
            if module.startswith("bench.") and \
                    not (ROOT / Path(*module.split("."))).with_suffix(".py").exists():
                out.append(f"`python -m {module}`: no such module")
            continue
        if not args or placeholder(args[0]) or args[0].startswith("-"):
            continue
        sub = choices.get(args[0])
        if sub is None:
            out.append(f"`{prog} {args[0]}`: no such command")
            continue
        for flag in (w.split("=")[0] for w in args[1:] if w.startswith("-")):
            if flag not in sub._option_string_actions:
                out.append(f"`{prog} {args[0]} {flag}`: no such option")
    return out


def page_problems(page: Path) -> list[str]:
    text = page.read_text()
    problems = link_problems(page, text)
    for lang, _ in blocks(text):
        if lang not in LANGUAGES:
            problems.append(f"a ``` block of language {lang or '(none)'!r}: use one of "
                            f"{sorted(LANGUAGES)}")
    for snippet in code(text):
        problems += path_problems(snippet) + name_problems(snippet) + command_problems(snippet)
    return problems


@pytest.mark.parametrize("page", PAGES, ids=lambda p: str(p.relative_to(ROOT)))
def test_every_mention_exists(page):
    problems = page_problems(page)
    assert not problems, f"{page.relative_to(ROOT)}:\n  " + "\n  ".join(problems)


KERNELS = [(page, i, body) for page in PAGES for i, (lang, body) in
           enumerate(blocks(page.read_text())) if lang == "ptxdsl"]


@pytest.mark.parametrize("page,index,body", KERNELS,
                         ids=[f"{p.relative_to(ROOT)}-{i}" for p, i, _ in KERNELS])
def test_every_whole_kernel_compiles(page, index, body):
    assert "kernel " in body, "a ```ptxdsl block holds whole kernels; mark a part " \
                              "```ptxdsl-fragment"
    assert ptxdsl.compile(body).ptx.startswith("//")


def test_readme_is_a_front_page_that_maps_every_docs_page():
    readme = (ROOT / "README.md").read_text()
    assert len(readme.splitlines()) <= 450
    linked = {t.partition("#")[0] for t in LINK.findall(readme)}
    pages = {f"docs/{p.name}" for p in (ROOT / "docs").glob("*.md")}
    assert pages - linked == set(), "docs pages missing from the README's map"
    assert "docs/adding-an-operation.md" in linked
    for command in ("python3 -m venv .venv && .venv/bin/pip install -e . && .venv/bin/ptxdsl "
                    "compile samples/add_one.ptxdsl -o add_one.ptx",
                    'python3 -m venv .venv && .venv/bin/pip install -e ".[test]" && '
                    ".venv/bin/pytest"):
        assert f"```sh\n{command}\n```" in readme
    (kernel,) = [b for lang, b in blocks(readme) if lang == "ptxdsl"]
    sample = ptxdsl.parse_file(ROOT / "samples" / "add_one.ptxdsl")
    assert ptxdsl.print_module(ptxdsl.parse(kernel)) == ptxdsl.print_module(sample)


def test_the_checks_catch_stale_mentions(tmp_path):
    page = tmp_path / "page.md"
    text = ("See [the map](nowhere.md), [a heading](#missing) and `samples/gone.ptxdsl`, "
            "`ptxdsl.nonesuch`, `from ptxdsl import f32, nothing_here`, "
            "`ptxdsl compile FILE --frobnicate`, `ptxdsl explode FILE`, "
            "`python -m bench nonesuch`, `python -m bench gemm --bogus`, "
            "`python -m bench.nonesuch`.\n\n# A heading\n\n"
            "```\nuntagged\n```\n")
    page.write_text(text)
    problems = "\n".join(page_problems(page))
    for expected in ("link to nowhere.md: no such file", "no heading '#missing'",
                     "path samples/gone.ptxdsl", "ptxdsl.nonesuch: ptxdsl has no nonesuch",
                     "ptxdsl.nothing_here", "`ptxdsl compile --frobnicate`: no such option",
                     "`ptxdsl explode`: no such command",
                     "`python -m bench nonesuch`: no such command",
                     "`python -m bench gemm --bogus`: no such option",
                     "`python -m bench.nonesuch`: no such module",
                     "language '(none)'"):
        assert expected in problems, expected
    assert "ptxdsl.f32" not in problems
    good = ("`ptxdsl compile samples/add_one.ptxdsl -o out/x.ptx --arch sm_80`, "
            "`ptxdsl.compile`, `ptxdsl.runtime.TensorMap`, `from ptxdsl.tools.autotune import "
            "Autotuner`, `python -m bench decode-gemm --m 1 --json bench/results/g.json`, "
            "`ptxdsl/kernels/<name>.ptxdsl`, [this](#a-heading)\n\n# A heading\n")
    page.write_text(good)
    assert page_problems(page) == []


def test_a_module_that_needs_torch_is_read_from_its_source(monkeypatch):
    monkeypatch.setitem(sys.modules, "torch", None)  # import torch fails, as without it
    for mod in [m for m in sys.modules if m.startswith("ptxdsl.torch")]:
        monkeypatch.delitem(sys.modules, mod)
    assert resolve("ptxdsl.torch.dispatch.register") is None
    assert resolve("ptxdsl.torch.opspec.OpSpec") is None
    assert resolve("ptxdsl.torch") is None
    assert "defines no nonesuch" in resolve("ptxdsl.torch.opspec.nonesuch")
