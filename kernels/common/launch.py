"""Kernel launches without the host work Triton repeats on every call.

`kernel[grid](...)` binds and specializes the arguments, turns the specialization into a cache key,
reads its runtime knobs, looks the compiled kernel up, checks the kernel's globals and builds launch
metadata, then launches. On the lent H100's host that is 25-50 us for a small kernel and 90-150 us for
a TMA GEMM (docs/performance.md), against ~10 us for a cuBLAS call: a Linear step of a dozen launches
spends more time on the host than an 8B model's GEMMs take on the GPU. What this module saves there:
7-24% of a launch's host time (docs/performance.md, "Cached launches").

`fast_launch` keeps the one part that decides which binary runs, Triton's own argument binder (so a
call specializes exactly as `kernel[grid]` would: pointer alignment, integer divisibility, dtypes,
constexprs, launch options), and remembers the compiled kernel under that specialization. Later
calls go straight to the compiled kernel's launcher. The first call of each specialization, every
call while a launch hook is set (a profiler such as proton) and every call under the interpreter or
with TURBO_OPT_TRITON_LAUNCH=triton (for A/B timing) go through `kernel[grid]`.

Triton's debug and instrumentation knobs are read when a specialization first launches: set them
before the first call, as Triton's own cache would not notice a change either for a kernel it has
already compiled under the same options.
"""

from __future__ import annotations

from collections.abc import Callable, Hashable
from typing import Any

import torch
from triton import knobs
from triton.runtime import driver
from triton.runtime.jit import JITFunction

import kernels


class FastLaunch:
    """A @triton.jit (or @gluon.jit) kernel launched as `kernel[grid](*args, **kwargs)`, cheaper."""

    def __init__(self, kernel: Any):
        self.kernel = kernel
        # The interpreter's InterpretedFunction has no compiled kernel to keep.
        self.direct = kernels.DIRECT_LAUNCH and isinstance(kernel, JITFunction)
        self.compiled: dict[Hashable, Any] = {}

    def __getitem__(self, grid: tuple[int, ...] | Callable[[dict], tuple[int, ...]]) -> Callable[..., None]:
        if not self.direct:
            return self.kernel[grid]
        return lambda *args, **kwargs: self.launch(grid, args, kwargs)

    def launch(self, grid: tuple[int, ...] | Callable[[dict], tuple[int, ...]], args: tuple,
               kwargs: dict[str, Any]) -> None:
        kernel = self.kernel
        enter_hook, exit_hook = knobs.runtime.launch_enter_hook, knobs.runtime.launch_exit_hook
        if kernel.pre_run_hooks or _hooked(enter_hook) or _hooked(exit_hook):  # a profiler listens: Triton's path
            kernel[grid](*args, **kwargs)
            return
        device = torch.cuda.current_device()
        try:  # Triton's binder: JITFunction internals, the same in Triton 3.6 to 3.9
            binder = kernel.device_caches[device][4]
        except (AttributeError, IndexError, KeyError, TypeError):  # another Triton: its path from now on
            self.direct = False
            kernel[grid](*args, **kwargs)
            return
        try:
            bound, specialization, options = binder(*args, **kwargs)
            key = (device, tuple(specialization), tuple(options.items()))
            compiled = self.compiled.get(key)
        except (TypeError, ValueError):  # arguments Triton refuses: let it say why
            kernel[grid](*args, **kwargs)
            return
        if compiled is None:
            self.compiled[key] = kernel[grid](*args, **kwargs)
            return
        if callable(grid):
            grid = grid(bound)
        size = len(grid)
        compiled.run(grid[0], grid[1] if size > 1 else 1, grid[2] if size > 2 else 1,
                     driver.active.get_current_stream(device), compiled.function, compiled.packed_metadata,
                     None, None, None, *bound.values())


def _hooked(hook: Any) -> bool:
    """Whether a Triton launch hook is set: a function, or a HookChain (Triton 3.6+) holding any."""
    return hook is not None and bool(getattr(hook, "calls", True))


def fast_launch(kernel: Any) -> FastLaunch:
    """Decorate a jitted kernel (above @triton.jit) so that its launches skip Triton's per-call work."""
    return FastLaunch(kernel)
