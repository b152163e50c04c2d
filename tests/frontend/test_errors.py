"""Error goldens: the full rendering of every diagnostic, compared as text.

Cases are split by `// -----`; each keeps its real line numbers in the file."""

from pathlib import Path

import pytest

import ptxdsl

HERE = Path(__file__).parents[1] / "errors"
SEP = "// -----"


def cases(path: Path) -> list[str]:
    lines = path.read_text().split("\n")
    out, start = [], 0
    for i, line in enumerate(lines + [SEP]):
        if line.strip() == SEP:
            # blank lines keep every case's line numbers equal to the file's
            out.append("\n" * start + "\n".join(lines[start:i]) + "\n")
            start = i + 1
    return out


def render(case: str, name: str) -> str:
    try:
        ptxdsl.parse(case, name)
    except ptxdsl.CompileError as e:
        return e.render()
    return "(no error)"


@pytest.mark.parametrize("name", ["semantic", "syntax"])
def test_error_golden(name, update_goldens):
    src = HERE / f"{name}.ptxdsl"
    rendered = f"\n{SEP}\n".join(render(c, src.name) for c in cases(src)) + "\n"
    golden = HERE / f"{name}.expected"
    if update_goldens:
        golden.write_text(rendered)
    assert rendered == golden.read_text()
    assert "(no error)" not in rendered


def test_all_errors_of_a_kernel_are_reported_together():
    with pytest.raises(ptxdsl.CompileError) as e:
        ptxdsl.parse("kernel k() threads(32) { let a = x; let b = y; let c = z; }")
    assert len(e.value.diagnostics) == 3
    assert "3 errors generated." in e.value.render()


def test_error_names_line_column_and_caret():
    with pytest.raises(ptxdsl.CompileError) as e:
        ptxdsl.parse("kernel k() threads(32) {\n    let a = tile;\n}\n", "f.ptxdsl")
    assert e.value.render() == (
        "f.ptxdsl:2:13: error: unknown name 'tile'\n"
        "    let a = tile;\n"
        "            ^~~~")


def test_a_kernel_defined_twice_is_a_located_error_with_a_note():
    with pytest.raises(ptxdsl.CompileError) as e:
        ptxdsl.parse("kernel k() threads(32) { }\nkernel k() threads(32) { }\n", "twice.ptxdsl")
    text = e.value.render()
    assert "twice.ptxdsl:2:8: error: kernel 'k' is defined twice" in text
    assert "twice.ptxdsl:1:8: note: first defined here" in text
