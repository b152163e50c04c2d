"""What each architecture ptxdsl compiles for has: a `Target` value per architecture, found
by name with `target("sm_90a")`.

A target holds the facts the compiler and runtime check against (the PTX header's `.target`
and `.version`, shared memory per CTA, mbarrier and cluster limits), its features as flags,
and its pass list (names of `ptxdsl.lower.STEPS`, the emitter last). Code asks a target's
flags and limits; it never compares architecture names. A new architecture is one more
`Target` in `_TARGETS`, naming the passes it runs.
"""

from __future__ import annotations

from dataclasses import dataclass, replace

from .errors import CompileError

# the passes of every Hopper build; the sm_80 list rewrites their form into Ampere's
_HOPPER_PASSES = ("turns", "pipelines", "verify", "emit")
_SM80_PASSES = ("turns", "pipelines", "verify", "sm80", "verify_sm80", "emit")


@dataclass(frozen=True, slots=True, kw_only=True)
class Target:
    """One architecture: its limits, its features and the passes a kernel runs for it."""

    name: str  # the PTX `.target` and ptxas's -arch
    ptx_version: tuple[int, int]  # the header's `.version` (raised where an instruction needs it)
    smem_bytes: int  # dynamic shared memory per CTA with the opt-in (the most a kernel may ask)
    mbarrier_max_count: int  # arrival count and tx-count of one mbarrier phase
    portable_cluster: int  # CTAs per cluster without the non-portable opt-in
    max_cluster: int  # CTAs per cluster with it
    tma: bool  # bulk and tensor copies (cp.async.bulk), tensor maps
    wgmma: bool  # warpgroup MMA (wgmma.mma_async)
    clusters: bool  # clusters of several CTAs, distributed shared memory
    multicast: bool  # copies multicast to a cluster's CTAs, as ptxas wants them
    setmaxnreg: bool  # warpgroup register reallocation
    elect: bool  # elect.sync
    griddepcontrol: bool  # programmatic dependent launch (griddepcontrol.wait)
    fp8_cvt: bool  # cvt between f32/f16 pairs and e4m3/e5m2 pairs (sm_89 on)
    # the driver JIT compiles the PTX for the device at hand: a cubin assembled for this
    # target would not load on the GPUs ptxdsl runs on (an sm_80 build on a Hopper part)
    jit: bool
    passes: tuple[str, ...]  # step names in order, the emitter ("emit") last

    @property
    def features(self) -> frozenset[str]:
        """The names of the feature flags this target has."""
        return frozenset(f for f in _FEATURES if getattr(self, f))


_FEATURES = ("tma", "wgmma", "clusters", "multicast", "setmaxnreg", "elect", "griddepcontrol",
             "fp8_cvt")

_SM_90A = Target(name="sm_90a", ptx_version=(8, 0), smem_bytes=232448,  # 227 KiB
                 mbarrier_max_count=(1 << 20) - 1, portable_cluster=8, max_cluster=16,
                 tma=True, wgmma=True, clusters=True, multicast=True, setmaxnreg=True,
                 elect=True, griddepcontrol=True, fp8_cvt=True, jit=False,
                 passes=_HOPPER_PASSES)

_TARGETS = {t.name: t for t in (
    Target(name="sm_80", ptx_version=(8, 0), smem_bytes=166912,  # the A100's opt-in, 163 KiB
           mbarrier_max_count=(1 << 20) - 1, portable_cluster=1, max_cluster=1, tma=False,
           wgmma=False, clusters=False, multicast=False, setmaxnreg=False, elect=False,
           griddepcontrol=False, fp8_cvt=False, jit=True, passes=_SM80_PASSES),
    # sm_90 lacks what PTX reserves for sm_90a (wgmma, setmaxnreg); multicast copies
    # assemble for it only with ptxas's advice to use sm_90a, so sm_90 refuses them too and
    # a compile naming no target picks sm_90a for them (`default_target`)
    replace(_SM_90A, name="sm_90", wgmma=False, multicast=False, setmaxnreg=False),
    _SM_90A,
)}

# What a compile that names no target starts from, and the targets it may end on: the
# first whose features cover what its kernels use
_DEFAULT_CHOICES = ("sm_90", "sm_90a")

# What the builder checks before a target is chosen: the most any target allows
MAX_SMEM_BYTES = max(t.smem_bytes for t in _TARGETS.values())
MBARRIER_MAX_COUNT = max(t.mbarrier_max_count for t in _TARGETS.values())
PORTABLE_CLUSTER = max(t.portable_cluster for t in _TARGETS.values())


def names() -> list[str]:
    """Every target's name, in order (the CLI's --arch choices)."""
    return list(_TARGETS)


def target(name: str | Target | None = None) -> Target:
    """The target called `name` (a Target is returned as it is; None: the default compile's
    starting target). An unknown name is a CompileError that lists the known ones."""
    if isinstance(name, Target):
        return name
    if name is None:
        name = _DEFAULT_CHOICES[0]
    try:
        return _TARGETS[name]
    except KeyError:
        raise CompileError(f"unknown target {name!r}; the targets are "
                           f"{', '.join(_TARGETS)}") from None


def default_target(used: frozenset[str]) -> Target:
    """The target of a compile that names none, for kernels that use the features `used`:
    sm_90, or sm_90a where a kernel uses what only it has."""
    for name in _DEFAULT_CHOICES:
        if used <= _TARGETS[name].features:
            return _TARGETS[name]
    return _TARGETS[_DEFAULT_CHOICES[-1]]
