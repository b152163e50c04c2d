"""The `ptxdsl` command line."""

from __future__ import annotations

import argparse
import contextlib
import os
import sys
import traceback
from collections.abc import Sequence

from ..errors import PtxdslError
from ..target import names, target

ARCHS = names()

DESCRIPTION = """\
ptxdsl compiles .ptxdsl kernels (Hopper mbarrier pipelines and bulk/TMA copies) to PTX.

examples:
  ptxdsl compile samples/add_one.ptxdsl -o add_one.ptx   write PTX
  ptxdsl compile k.ptxdsl --emit ir                      show the checked IR
  ptxdsl compile k.ptxdsl --emit ir --after turns        ... as it is after one pass
  ptxdsl check k.ptxdsl                                  report every problem, write nothing
  ptxdsl fmt k.ptxdsl                                    print the canonical text
  ptxdsl compile ptxdsl/kernels/norms.ptxdsl -D N=4096   set a compile-time parameter
  ptxdsl kernels --build all -o out                      the kernel library's default PTX

Errors are printed as file:line:col with the source line; the exit status is 1.
Set PTXDSL_DEBUG=1 to see Python tracebacks.
"""


def _parser() -> argparse.ArgumentParser:
    p = argparse.ArgumentParser(prog="ptxdsl", description=DESCRIPTION,
                                formatter_class=argparse.RawDescriptionHelpFormatter)
    sub = p.add_subparsers(dest="command", metavar="COMMAND")
    sub.required = True

    c = sub.add_parser("compile", help="compile a .ptxdsl file to PTX",
                       description="Compile FILE; print the result or write it to OUT.")
    c.add_argument("file", metavar="FILE", help="the .ptxdsl source")
    c.add_argument("-o", "--output", metavar="OUT", help="output file (default: stdout)")
    c.add_argument("--arch", choices=ARCHS, default=None,
                   help="PTX target (default: sm_90, or sm_90a when an sm_90a-only feature "
                        "is used); sm_80 lowers bulk and tensor copies to Ampere cp.async")
    c.add_argument("--emit", choices=["ptx", "ir", "ast"], default="ptx",
                   help="what to write: PTX (default), the checked IR (the emitter's input, "
                        "for --arch), or the parse tree")
    lists = "; ".join(f"{n}: {', '.join(target(n).passes)}" for n in ARCHS)
    c.add_argument("--after", metavar="PASS", default=None,
                   help=f"with --emit ir: the IR after this pass of the target's list ({lists}); "
                        "PTXDSL_DUMP=DIR writes every stage of every compile")
    c.add_argument("--watchdog", metavar="MS", type=int, default=0,
                   help="bound every mbarrier wait to MS milliseconds; a timed-out wait "
                        "reports its barrier, parity, role and line and stops the kernel")

    k = sub.add_parser("check", help="parse and verify a .ptxdsl file",
                       description="Report every problem in FILE; write nothing.")
    k.add_argument("file", metavar="FILE")
    k.add_argument("--arch", choices=ARCHS, default=None,
                   help="also report what does not lower to this target (sm_80: Hopper-only "
                        "operations)")

    f = sub.add_parser("fmt", help="print a .ptxdsl file in canonical form")
    f.add_argument("file", metavar="FILE")

    r = sub.add_parser("run", help="run a sample on the GPU and check it against numpy",
                       description="Compile FILE, run each kernel (or --kernel) on fresh random "
                                   "inputs from the example() of its Python twin (FILE with .py), "
                                   "and compare with the numpy reference. Needs a CUDA GPU.")
    r.add_argument("file", metavar="FILE")
    r.add_argument("--kernel", help="run only this kernel")
    r.add_argument("--seed", type=int, default=None, help="random seed for the inputs")
    r.add_argument("--watchdog", metavar="MS", type=int, default=0,
                   help="bound every mbarrier wait to MS milliseconds")
    r.add_argument("--small", action="store_true",
                   help="use the sample's small (interpreter) sizes")
    r.add_argument("--sanitize", metavar="TOOLS", default=None,
                   help="run under compute-sanitizer: 'all' or a comma-separated list of "
                        "memcheck, racecheck, synccheck, initcheck")
    r.add_argument("--arch", choices=ARCHS, default=None, help="PTX target (see compile)")

    i = sub.add_parser("interp", help="run a sample in the CPU interpreter and check it",
                       description="Like `run`, on the CPU: threads in warps, async copies that "
                                   "complete late in seeded orders, mbarrier phases; reports "
                                   "deadlocks and races with their source lines. No GPU needed.")
    i.add_argument("file", metavar="FILE")
    i.add_argument("--kernel", help="run only this kernel")
    i.add_argument("--seed", type=int, default=0, help="schedule and input seed")
    i.add_argument("--max-steps", metavar="N", type=int, default=None,
                   help="steps one CTA may take before it is taken to loop forever (default "
                        "1000000); the twin's SMALL sizes keep a run short")
    i.add_argument("--ranks", metavar="N", type=int, default=None,
                   help="run a multi-rank kernel as N ranks over one global memory (symmetric "
                        "buffers, peer flags): the twin's ranks_example(rng, world) returns "
                        "{'grid', 'ranks': [the arguments of each rank], 'expected': {name: "
                        "array}}, an array passed to several ranks being one buffer they share")
    t = sub.add_parser("autotune", help="list (or clear) the autotuned configs on disk",
                       description="The launch configs the torch ops chose per shape, as "
                                   "cached in $PTXDSL_CACHE_DIR/autotune (default "
                                   "~/.cache/ptxdsl/autotune), with each candidate's time.")
    t.add_argument("--clear", action="store_true", help="delete them (each op tunes again)")
    lib = sub.add_parser("kernels", help="list the kernel library's families, or build them",
                         description="One line per family of ptxdsl.kernels: its name, what it "
                                     "computes, its parameters and their defaults. With "
                                     "--build, write each named family's default PTX to "
                                     "OUT/<family>.ptx.")
    lib.add_argument("--build", metavar="NAMES", help="'all', or family names separated by "
                                                      "commas")
    lib.add_argument("-o", "--output", metavar="OUT", help="directory for --build's PTX")
    lib.add_argument("--arch", choices=ARCHS, default=None,
                     help="target of --build (default: as `compile` picks, per family)")
    for cmd in (c, k, f, r, i):
        cmd.add_argument("-D", dest="defines", metavar="NAME=VALUE", action="append",
                         default=[], help="give compile-time kernel parameter NAME (kernel "
                                          "k<NAME: u32>(...)) its value; repeatable")
    i.add_argument("--arch", choices=ARCHS, default=None,
                   help="run the kernel as compiled for this target (sm_80: cp.async)")
    return p


def _defines(items: list[str]) -> dict[str, str]:
    """-D NAME=VALUE options as a dict (VALUE is read by the parameter's type)."""
    from ..errors import CompileError

    out: dict[str, str] = {}
    for item in items:
        name, eq, value = item.partition("=")
        if not eq or not name.strip() or not value.strip():
            raise CompileError(f"-D {item}: expected NAME=VALUE, e.g. -D N=8192")
        out[name.strip()] = value.strip()
    return out


def _write(text: str, output: str | None) -> None:
    if output is None or output == "-":
        sys.stdout.write(text)
        return
    tmp = output + ".tmp"
    try:
        with open(tmp, "w") as fh:  # written whole, then renamed: never a half-written file
            fh.write(text)
        os.replace(tmp, output)
    except OSError as e:
        with contextlib.suppress(OSError):  # the half-written file, where there is one
            os.unlink(tmp)
        raise _cannot_write(output, e) from None


def _cannot_write(path: object, e: OSError) -> PtxdslError:
    """An output path the system refuses (missing folder, no permission): the user's to mend."""
    return PtxdslError(f"cannot write '{path}': {e.strerror or e}")


def run(argv: Sequence[str] | None = None) -> int:
    from ..bounds import stack_room

    with stack_room():  # the passes recurse once per level of nesting (bounds.MAX_NESTING)
        return _command(_parser().parse_args(argv))


def _command(args: argparse.Namespace) -> int:
    from ..compiler import compile_module
    from ..errors import CompileError
    from ..frontend import parse, parse_tree, read_source
    from ..printer import print_module

    if args.command in ("run", "interp"):
        return _run(args)
    if args.command == "autotune":
        return _autotune(args)
    if args.command == "kernels":
        return _kernels(args)
    if args.command == "compile" and args.after is not None and args.emit != "ir":
        raise CompileError(f"--after {args.after} shows the IR after a pass: add --emit ir")
    src = read_source(args.file)
    if args.command == "compile" and args.emit == "ast":
        _write(parse_tree(src).pretty(), args.output)
        return 0
    module = parse(src.text, src.name, _defines(args.defines))
    if args.command == "fmt":
        _write(print_module(module), None)
        return 0
    if args.command == "check":
        from ..lower import lower

        lower(module, args.arch, warn=lambda w: print(w.render(), file=sys.stderr))
        n = len(module.kernels)
        target = f", lowers to {args.arch}" if args.arch else ""
        print(f"{src.name}: ok ({n} kernel{'s' if n != 1 else ''}{target})")
        return 0
    if args.emit == "ir":
        from ..lower import lower

        _write(print_module(lower(module, args.arch, until=args.after)), args.output)
        return 0
    ptx = compile_module(module, arch=args.arch, source_name=src.name,
                         watchdog_ms=max(0, args.watchdog))
    _write(ptx.ptx, args.output)
    return 0


def _autotune(args: argparse.Namespace) -> int:
    from . import autotune

    directory = autotune.autotune_dir()
    if args.clear:
        files = sorted(directory.glob("*.json"))
        for path in files:
            path.unlink()
        print(f"{directory}: removed {len(files)} file{'s' * (len(files) != 1)}")
        return 0
    lines = autotune.describe()
    print("\n".join(lines) if lines else f"{directory}: no tuned configs")
    return 0


def _kernels(args: argparse.Namespace) -> int:
    """`ptxdsl kernels`: list the library's families, or write their default PTX."""
    from pathlib import Path

    from ..errors import CompileError
    from ..kernels import families

    fams = families()
    if args.build is None:
        width = max(map(len, fams))
        for fam in fams.values():
            params = ", ".join(f"{k}={v}" for k, v in fam.parameters().items())
            print(f"{fam.name:<{width}}  {fam.summary}  ({params})")
        return 0
    if args.output is None:
        print("ptxdsl kernels: --build needs -o DIR (where the PTX files go)", file=sys.stderr)
        return 1
    names = list(fams) if args.build.strip() == "all" else \
        [n.strip() for n in args.build.split(",") if n.strip()]
    unknown = [n for n in names if n not in fams]
    if unknown or not names:
        print(f"ptxdsl kernels: no family {', '.join(map(repr, unknown)) or 'named'}; the "
              f"families are: {', '.join(fams)} (or 'all')", file=sys.stderr)
        return 1
    out = Path(args.output)
    try:
        out.mkdir(parents=True, exist_ok=True)
    except OSError as e:
        raise _cannot_write(out, e) from None
    written = 0
    for name in names:
        try:
            built = fams[name].build().program(args.arch).ptx_module
        except CompileError as e:  # a Hopper-only family has no sm_80 form
            why = e.diagnostics[0].message
            print(f"ptxdsl kernels: {name}: skipped" + (f", no {args.arch} form ({why})"
                  if args.arch else f": {why}"), file=sys.stderr)
            continue
        _write(built.ptx, str(out / f"{name}.ptx"))
        print(f"{out / f'{name}.ptx'}: {name} ({built.arch})")
        written += 1
    return 0 if written else 1


def _run(args: argparse.Namespace) -> int:
    from .runner import interp_sample, run_sample

    if args.command == "run" and args.sanitize is not None:
        return _sanitize(args)
    if args.command == "interp":
        if args.max_steps is not None and args.max_steps < 1:
            raise PtxdslError(f"--max-steps {args.max_steps}: expected a positive number of "
                              "steps, e.g. --max-steps 5000000")
        if args.ranks is not None:
            return _interp_ranks(args)
        runs = interp_sample(args.file, kernel=args.kernel, seed=args.seed,
                             defines=_defines(args.defines), arch=args.arch,
                             max_steps=args.max_steps)
    else:
        runs = run_sample(args.file, kernel=args.kernel, seed=args.seed, arch=args.arch,
                          watchdog_ms=max(0, args.watchdog), small=args.small,
                          defines=_defines(args.defines))
    failed = 0
    for name, results in runs:
        for r in results:
            status = "PASS" if r.ok else "FAIL"
            failed += not r.ok
            if r.exact and not r.ok:  # an element-for-element mismatch has no error size
                print(f"{status} {name}: {r.name}: {r.detail}")
                continue
            extra = f": {r.detail}" if r.detail else ""
            print(f"{status} {name}: {r.name} max |err| {r.max_abs_err:.3g}, relative "
                  f"{r.max_rel_err:.3g}{extra}")
    return 1 if failed else 0


def _interp_ranks(args: argparse.Namespace) -> int:
    """`interp --ranks N`: one launch a rank over one global memory (`interp.run_ranks`, as
    tests/multigpu drives it), then each expected array compared after every rank ran."""
    from pathlib import Path

    import numpy as np

    from ..frontend import parse_file
    from ..interp import run_ranks
    from ..interp.run import DEFAULT_MAX_STEPS
    from .runner import compare, import_twin

    if args.ranks < 1:
        raise PtxdslError(f"--ranks {args.ranks}: expected a positive number of ranks, e.g. "
                          "--ranks 4")
    module = parse_file(args.file, _defines(args.defines))
    path = Path(args.file).with_suffix(".py")
    if not path.is_file():
        raise PtxdslError(f"{args.file}: no Python twin {path.name} with a ranks_example()")
    make = getattr(import_twin(path), "ranks_example", None)
    if make is None:
        raise PtxdslError(f"{args.file}: --ranks needs ranks_example(rng, world) in the twin, "
                          "returning {'grid': ..., 'ranks': [one argument dict a rank], "
                          "'expected': {name: array}}")
    ex = make(np.random.default_rng(args.seed), args.ranks)
    per_rank = ex.get("ranks") if isinstance(ex, dict) else None
    if not isinstance(per_rank, list) or len(per_rank) != args.ranks or "grid" not in ex:
        raise PtxdslError(f"{args.file}: ranks_example(rng, {args.ranks}) must return a dict "
                          f"with 'grid' and 'ranks', a list of {args.ranks} argument dicts")
    name = args.kernel or ex.get("kernel")
    if name is None and len(module.kernels) != 1:
        raise PtxdslError(f"{args.file} has several kernels: name one with --kernel")
    names = [k.name for k in module.kernels]
    if name is not None and name not in names:
        raise PtxdslError(f"{args.file} has no kernel '{name}' (it has {', '.join(names)})")
    k = module.kernel(name)
    run_ranks(k, ex["grid"], per_rank, seed=args.seed, arch=args.arch,
              max_steps=args.max_steps or DEFAULT_MAX_STEPS)
    failed = 0
    for out, want in ex.get("expected", {}).items():
        got = [r[out] for r in per_rank if out in r]
        if not got:
            raise PtxdslError(f"{args.file}: expected '{out}' is no rank's argument")
        arr = got[0] if all(g is got[0] for g in got) else np.stack(got)  # shared, or a rank each
        r = compare(out, arr, want, None, ex.get("rtol", 0.0), ex.get("atol", 0.0))
        failed += not r.ok
        print(f"{'PASS' if r.ok else 'FAIL'} {k.name} x {args.ranks} ranks: {r.name}"
              f"{': ' + r.detail if r.detail else ''}")
    return 1 if failed else 0


def _sanitize(args: argparse.Namespace) -> int:
    from .sanitize import parse_tools, sanitize

    given = (("--kernel", args.kernel), ("--seed", args.seed), ("--arch", args.arch),
             *(("-D", d) for d in args.defines))
    extra = [a for flag, v in given if v is not None for a in (flag, str(v))] + \
        (["--small"] if args.small else [])
    failed = 0
    for r in sanitize(args.file, parse_tools(args.sanitize), extra):
        failed += r.returncode != 0
        print(f"{r.tool}: {r.status}")
        if r.returncode != 0:
            print(r.output.rstrip())
    return 1 if failed else 0


def main(argv: Sequence[str] | None = None) -> int:
    debug = os.environ.get("PTXDSL_DEBUG") == "1"
    try:
        return run(argv)
    except PtxdslError as e:
        if debug:
            traceback.print_exc()
        print(e.render(), file=sys.stderr)
        return 1
    except KeyboardInterrupt:
        return 130
    except BrokenPipeError:
        return 1
    except Exception as e:  # an internal bug: say so plainly, never dump on the user
        if debug:
            traceback.print_exc()
        print(f"ptxdsl: internal error: {type(e).__name__}: {e}\n"
              "(this is a bug in ptxdsl; set PTXDSL_DEBUG=1 for the traceback)", file=sys.stderr)
        return 2
