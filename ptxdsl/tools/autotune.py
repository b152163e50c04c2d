"""Autotuning: choose a kernel family's configuration by timing every candidate once per
shape key, and remember the choice in memory and in a JSON file on disk.

Nothing here touches a GPU or imports torch: launching a candidate (`run`), comparing two
outputs (`same`), timing (`timer`) and describing the machine (`machine`) are functions the
caller gives, so the selection and the cache are testable anywhere. `ptxdsl.torch` gives
the CUDA-event timer and torch's comparison.

A disk entry is keyed by the GPU name, the driver version, the ptxdsl version, a hash of the
PTX of every candidate and the shape key: a new driver, a new ptxdsl or a changed kernel
tunes again. Files live in `$PTXDSL_CACHE_DIR/autotune` (default `~/.cache/ptxdsl/autotune`),
one per op. `PTXDSL_AUTOTUNE=0` skips tuning and the cache (the family's default config
runs). A call that tunes a shape prints one line to stderr (the op, the shape, the
candidates, the seconds it took: a first call can take seconds and should not look hung);
answers from memory or disk print nothing. `PTXDSL_AUTOTUNE_LOG=1` also prints every
decision, cached ones included, with each candidate's time.
"""

from __future__ import annotations

import hashlib
import json
import os
import sys
import tempfile
import time
from collections.abc import Callable, Hashable, Mapping, Sequence
from functools import partial
from pathlib import Path
from typing import Any

from .. import __version__
from ..runtime.compile import cache_dir

Config = Mapping[str, Any]  # a candidate's settings: JSON scalars by name (bn, stages, ...)
Timer = Callable[[Callable[[], Any]], float]  # milliseconds of one call of the function

_FORMAT = 1  # the layout of the JSON files; entries of another layout are ignored


def enabled() -> bool:
    """False when `PTXDSL_AUTOTUNE=0`: use each family's default config."""
    return os.environ.get("PTXDSL_AUTOTUNE", "1") != "0"


def logging_enabled() -> bool:
    return os.environ.get("PTXDSL_AUTOTUNE_LOG", "0") not in ("", "0")


def autotune_dir() -> Path:
    """Where the JSON files live (it may not exist yet)."""
    return cache_dir() / "autotune"


def config_text(config: Config) -> str:
    """`bn=128, stages=4`: a config as the log and error messages show it."""
    return ", ".join(f"{k}={v}" for k, v in config.items())


def ptx_hash(ptxs: Sequence[str]) -> str:
    """A short hash of the PTX texts of a family's candidates, in order."""
    h = hashlib.sha256()
    for ptx in ptxs:
        h.update(ptx.encode())
        h.update(b"\0")
    return h.hexdigest()[:16]


def entry_key(op: str, machine: Mapping[str, str], ptx: str, shape: Sequence[Any]) -> str:
    """The disk key of one decision (a JSON text, so a reader of the file can see it)."""
    fields = {"op": op, **machine, "ptxdsl": __version__, "ptx": ptx, "shape": list(shape)}
    return json.dumps(fields, sort_keys=True)


class DiskCache:
    """Decisions in `<directory>/<op>.json`: {"format": 1, "entries": {key: entry}}.

    A write re-reads the file and replaces it atomically, so processes tuning at once lose
    no one's entries but the same key's; an unreadable file counts as empty."""

    def __init__(self, directory: Path | None = None):
        self._directory = directory

    @property
    def directory(self) -> Path:
        return self._directory if self._directory is not None else autotune_dir()

    def path(self, op: str) -> Path:
        return self.directory / f"{op.replace('::', '.')}.json"

    def entries(self, op: str) -> dict[str, Any]:
        try:
            data = json.loads(self.path(op).read_text())
        except (OSError, ValueError):
            return {}
        if not isinstance(data, dict) or data.get("format") != _FORMAT:
            return {}
        entries = data.get("entries")
        return entries if isinstance(entries, dict) else {}

    def get(self, op: str, key: str) -> dict[str, Any] | None:
        entry = self.entries(op).get(key)
        return entry if isinstance(entry, dict) else None

    def put(self, op: str, key: str, entry: dict[str, Any]) -> None:
        path = self.path(op)
        path.parent.mkdir(parents=True, exist_ok=True)
        entries = self.entries(op)
        entries[key] = entry
        fd, tmp = tempfile.mkstemp(dir=path.parent, prefix=path.name, suffix=".tmp")
        try:
            with os.fdopen(fd, "w") as f:
                json.dump({"format": _FORMAT, "entries": entries}, f, indent=1, sort_keys=True)
            os.replace(tmp, path)
        except BaseException:
            Path(tmp).unlink(missing_ok=True)
            raise


def describe(cache: DiskCache | None = None) -> list[str]:
    """The decisions on disk, a line each: op, GPU, driver, ptxdsl version, shape, the chosen
    config and the time of each candidate timed (for `ptxdsl autotune`)."""
    cache = cache if cache is not None else DiskCache()
    lines = []
    for path in sorted(cache.directory.glob("*.json")):
        op = path.stem.replace(".", "::", 1)
        for key, entry in sorted(cache.entries(op).items()):
            try:
                fields = json.loads(key)
                config = config_text(entry["config"])
                timed = sorted(entry.get("ms", {}).items(), key=lambda cm: cm[1])
                times = ", ".join(f"[{c}] {ms:.4f} ms" for c, ms in timed)  # fastest first
            except (ValueError, TypeError, KeyError, AttributeError):
                continue  # an entry of another shape: not ours to explain
            lines.append(f"{fields.get('op', op)} on {fields.get('gpu', '?')} (driver "
                         f"{fields.get('driver', '?')}, ptxdsl {fields.get('ptxdsl', '?')}) "
                         f"shape {tuple(fields.get('shape', ()))}: {config}"
                         + (f" ({times})" if times else ""))
    return lines


class Autotuner:
    """The configuration choice of one kernel family (one op, fixed compile-time settings).

    `configs`: the candidates, the default first (its output is the reference the others
    must match). `ptx(config)`: a candidate's PTX, hashed into the disk key once per tuner;
    `prepare(configs)`, if given, runs first (it may build every candidate at once).
    `machine(device)`: {"gpu": name, "driver": version} of a device. `timer(fn)`: the time
    of `fn()` in milliseconds."""

    def __init__(
        self,
        op: str,
        configs: Sequence[Config],
        *,
        ptx: Callable[[Config], str],
        machine: Callable[[Hashable], Mapping[str, str]],
        timer: Timer,
        cache: DiskCache | None = None,
        prepare: Callable[[Sequence[Config]], Any] | None = None,
    ):
        if not configs:
            raise ValueError(f"{op}: an autotuner needs at least one config")
        self.op = op
        self.configs = tuple(dict(c) for c in configs)
        self._ptx, self._machine, self.timer, self._prepare = ptx, machine, timer, prepare
        self.cache = cache if cache is not None else DiskCache()
        self._hash: str | None = None
        self._chosen: dict[tuple[Hashable, tuple], Config] = {}

    @property
    def default(self) -> Config:
        return self.configs[0]

    def ptx_hash(self) -> str:
        if self._hash is None:
            if self._prepare is not None:
                self._prepare(self.configs)
            self._hash = ptx_hash([self._ptx(c) for c in self.configs])
        return self._hash

    def choose(
        self,
        shape: tuple,
        run: Callable[[Config], Any],
        same: Callable[[Any, Any], bool],
        *,
        device: Hashable = 0,
        tune: bool = True,
    ) -> Config:
        """The config for `shape` on `device`: remembered, read from disk, or found by
        running and timing every candidate (`run(config)` launches once and returns its
        output). With `tune=False` (e.g. while a CUDA graph is captured) a config not
        known yet is the default, and nothing is remembered."""
        if not enabled():
            return self.default
        hit = self._chosen.get((device, shape))
        if hit is not None:
            return hit
        start = time.perf_counter()  # building the candidates (ptx_hash) counts as tuning
        key = entry_key(self.op, self._machine(device), self.ptx_hash(), shape)
        entry = self.cache.get(self.op, key)
        config = entry.get("config") if entry else None
        if config in self.configs:
            self._log(f"{shape}: {config_text(config)} (from {self.cache.path(self.op)})")
        elif not tune:
            return self.default
        else:
            config, times = self._tune(shape, run, same)
            self.cache.put(self.op, key, {"config": config, "ms": times})
            candidates = "; ".join(f"[{config_text(c)}]" for c in self.configs)
            print(f"ptxdsl: tuned {self.op} for shape {shape} over {len(self.configs)} "
                  f"candidates ({candidates}) in {time.perf_counter() - start:.2f} s: "
                  f"{config_text(config)}", file=sys.stderr)
        self._chosen[(device, shape)] = config
        return config

    def _tune(
        self, shape: tuple, run: Callable[[Config], Any], same: Callable[[Any, Any], bool]
    ) -> tuple[Config, dict[str, float]]:
        reference = run(self.default)  # the default must run: its failure is the caller's
        times: dict[str, float] = {}
        rejected: list[str] = []
        for config in self.configs:
            text = config_text(config)
            if config is not self.default:
                try:
                    out = run(config)
                except Exception as e:  # a candidate the device cannot run is skipped
                    rejected.append(f"{text}: {type(e).__name__}: {e}")
                    continue
                if not same(out, reference):
                    rejected.append(f"{text}: output differs from the default's")
                    continue
            times[text] = self.timer(partial(run, config))
        best = min(times, key=times.__getitem__)
        chosen = next(c for c in self.configs if config_text(c) == best)
        summary = ", ".join(f"[{t}] {ms:.4f} ms" for t, ms in times.items())
        self._log(f"{shape}: tuned {best} ({summary})")
        for r in rejected:
            self._log(f"{shape}: rejected {r}")
        return chosen, times

    def _log(self, message: str) -> None:
        if logging_enabled():
            print(f"ptxdsl autotune {self.op} {message}", file=sys.stderr)
