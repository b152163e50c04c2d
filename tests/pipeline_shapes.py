"""Pipeline kernels of many shapes, for the producer-tail tests (test_pipeline_shapes.py).

A shape says which warps run the pipeline in which roles, which threads acquire (one elected
thread per warp, lane 0 of each warp, one thread, or every thread of some warps) and which
wait (every thread, the even lanes, or lane 0 of some warps), how acquire and wait are
scheduled (in the same iteration, the producer fetching ahead by the stage count, or in two
separate loops), and the stage count. Every acquiring thread copies 16 bytes of a batch into
its part of the stage; every waiting thread reads one element of it:
out[cta, b, ci] = 3 * in[cta, b, ci mod E] + 1. With `dependent`, the acquire also depends on
the batch index, which no derivation can follow: the compiler must reject it, located.
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np


@dataclass(frozen=True)
class Shape:
    nwarps: int
    layout: str  # "none": no role; "one": one role over every warp; "split": two roles
    acq_warps: tuple[int, int]
    acq: str  # "elect", "lane0", "tid", "all"
    wait_warps: tuple[int, int]
    waiters: str  # "all", "even", "lane0"
    schedule: str  # "lockstep", "prefetch", "separate"
    stages: int
    dependent: bool = False

    # ------------------------------------------------------------------ sizes

    @property
    def acquirers(self) -> int:
        n = self.acq_warps[1] - self.acq_warps[0]
        return {"elect": n, "lane0": n, "tid": 1, "all": 32 * n}[self.acq]

    @property
    def elems(self) -> int:
        """Elements of one batch: 4 (16 bytes) per acquiring thread."""
        return 4 * self.acquirers

    @property
    def consumers(self) -> int:
        n = self.wait_warps[1] - self.wait_warps[0]
        return {"all": 32 * n, "even": 16 * n, "lane0": n}[self.waiters]

    def acquire_threads(self) -> set[int]:
        w0, w1 = self.acq_warps
        if self.acq == "tid":
            return {32 * w0 + 1}
        if self.acq == "all":
            return set(range(32 * w0, 32 * w1))
        return {32 * w for w in range(w0, w1)}

    def wait_threads(self) -> set[int]:
        v0, v1 = self.wait_warps
        step = {"all": 1, "even": 2, "lane0": 32}[self.waiters]
        return set(range(32 * v0, 32 * v1, step))

    # ------------------------------------------------------------------ text

    def _warps(self, w0: int, w1: int) -> list[str]:
        conds = []
        if w0 > 0:
            conds.append(f"%warp >= {w0}")
        if w1 < self.nwarps:
            conds.append(f"%warp < {w1}")
        return conds

    def _acquire(self, f: str, pad: str, loop: bool = False) -> str:
        """The producer's block for batch `f` with its guard; `loop`: the guard holds a
        loop over every batch."""
        w0, w1 = self.acq_warps
        conds = self._warps(w0, w1)
        ai = {"elect": f"%warp - {w0}", "lane0": f"%warp - {w0}", "tid": "0",
              "all": f"%tid.x - {32 * w0}"}[self.acq]
        if self.acq == "lane0":
            conds.append("%laneid == 0")
        if self.acq == "tid":
            conds = [f"%tid.x == {32 * w0 + 1}"]
        body = ["acquire(ring);",
                f"bulk_load(ring.buf[{ai}], global_in[(%ctaid.x * nbatch + {f}) * "
                f"{self.elems} + ({ai}) * 4]);",
                "commit(ring);"]
        if self.dependent:
            body = _nest([f"{f} < nbatch + 1"], body)
        if loop:
            body = [f"for {f} in 0 .. nbatch {{", *["    " + b for b in body], "}"]
        if self.acq == "elect":
            body = _nest(["elect()"], body)
        return "\n".join(pad + b for b in _nest(conds, body))

    def _consume(self, b: str, pad: str, loop: bool = False) -> str:
        v0, v1 = self.wait_warps
        conds = self._warps(v0, v1)
        ci = {"all": f"(%tid.x - {32 * v0})", "even": f"((%tid.x - {32 * v0}) >> 1)",
              "lane0": f"(%warp - {v0})"}[self.waiters]
        if self.waiters == "even":
            conds.append("(%laneid & 1) == 0")
        if self.waiters == "lane0":
            conds.append("%laneid == 0")
        e = f"{ci} % {self.elems}"
        body = ["wait(ring);",
                f"global_out[(%ctaid.x * nbatch + {b}) * {self.consumers} + {ci}] = "
                f"ring.buf[({e}) / 4, ({e}) % 4] * 3 + 1;",
                "release(ring);"]
        if loop:
            body = [f"for {b} in 0 .. nbatch {{", *["    " + x for x in body], "}"]
        return "\n".join(pad + x for x in _nest(conds, body))

    def _sides(self, producer: bool, consumer: bool, pad: str) -> list[str]:
        """The schedule of one role (or of the kernel), with the sides it runs."""
        out = []
        if self.schedule == "separate":
            if producer:
                out.append(self._acquire("b", pad, loop=True))
            if consumer:
                out.append(self._consume("c", pad, loop=True))
            return out
        if self.schedule == "prefetch" and producer:
            out.append(f"{pad}let fetch: u32 = 0;")
        out.append(f"{pad}for b in 0 .. nbatch {{")
        inner = pad + "    "
        if producer and self.schedule == "prefetch":
            out += [f"{inner}while fetch < nbatch && fetch < b + {self.stages} {{",
                    self._acquire("fetch", inner + "    "),
                    f"{inner}    fetch = fetch + 1;", f"{inner}}}"]
        elif producer:
            out.append(self._acquire("b", inner))
        if consumer:
            out.append(self._consume("b", inner))
        out.append(f"{pad}}}")
        return out

    def text(self) -> str:
        lines = [f"kernel shape(global_in: ptr<s32>, global_out: ptr<s32>, nbatch: u32) "
                 f"threads({32 * self.nwarps}) {{",
                 f"    pipeline ring stages {self.stages} {{",
                 f"        buf: s32[{self.acquirers}][4] align 16;", "    }"]
        if self.layout == "none":
            lines += self._sides(True, True, "    ")
        elif self.layout == "one":
            lines.append(f"    role all warps 0 .. {self.nwarps} {{")
            lines += self._sides(True, True, "        ")
            lines.append("    }")
        else:
            split = self.wait_warps[0]
            lines.append(f"    role producer warps 0 .. {split} {{")
            lines += self._sides(True, False, "        ")
            lines += ["    }", f"    role consumer warps {split} .. {self.nwarps} {{"]
            lines += self._sides(False, True, "        ")
            lines.append("    }")
        lines.append("}")
        return "\n".join(lines) + "\n"

    # ------------------------------------------------------------------ data

    def example(self, rng: np.random.Generator, nbatch: int, nctas: int = 1) -> dict:
        x = rng.integers(-(1 << 20), 1 << 20, size=(nctas, nbatch, self.elems), dtype=np.int32)
        idx = np.arange(self.consumers) % self.elems
        want = x[:, :, idx] * 3 + 1
        return {"grid": nctas, "inputs": {"global_in": x.reshape(-1), "nbatch": nbatch},
                "outputs": {"global_out": np.empty(want.size, np.int32)},
                "expected": {"global_out": want.reshape(-1)}}


def _nest(conds: list[str], body: list[str]) -> list[str]:
    """`body` under `if c1 && c2 ... { }` (unchanged without conditions)."""
    if not conds:
        return body
    return [f"if {' && '.join(conds)} {{", *["    " + b for b in body], "}"]
