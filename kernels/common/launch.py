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
calls go straight to the compiled kernel's native launcher. The first call of each specialization, every
call while a launch hook is set (a profiler such as proton) and every call under the interpreter or
with TURBO_OPT_TRITON_LAUNCH=triton (for A/B timing) go through `kernel[grid]`.

Host tensor descriptors are encoded once per value. Triton's launcher encodes each one on every call
(`cuTensorMapEncodeTiled` and the Python around it, two or three a TMA GEMM). The encoding is a pure
function of the base address, shape, strides and padding, and of the kernel's block and swizzle, which
the compiled kernel fixes. A training loop's caching allocator hands the same addresses back step after
step, so after the first step every descriptor comes from the memo. The memo holds addresses, never
tensors, and keeps at most DESCRIPTORS_KEPT encodings per kernel argument.

Triton's debug and instrumentation knobs are read when a specialization first launches: set them
before the first call, as Triton's own cache would not notice a change either for a kernel it has
already compiled under the same options.
"""

from __future__ import annotations

from collections.abc import Callable, Hashable
from typing import Any

import torch
from triton import knobs
from triton.backends.nvidia import driver as nvidia
from triton.runtime import driver
from triton.runtime.jit import JITFunction

import kernels


class FastLaunch:
    """A @triton.jit (or @gluon.jit) kernel launched as `kernel[grid](*args, **kwargs)`, cheaper."""

    def __init__(self, kernel: Any):
        self.kernel = kernel
        # The interpreter's InterpretedFunction has no compiled kernel to keep.
        self.direct = kernels.DIRECT_LAUNCH and isinstance(kernel, JITFunction)
        self.compiled: dict[Hashable, CompiledLaunch] = {}

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
            self.compiled[key] = CompiledLaunch(kernel[grid](*args, **kwargs))
            return
        if callable(grid):
            grid = grid(bound)
        size = len(grid)
        compiled.launch(grid[0], grid[1] if size > 1 else 1, grid[2] if size > 2 else 1,
                        driver.active.get_current_stream(device), list(bound.values()))


DESCRIPTORS_KEPT = 64  # encodings memoized per descriptor argument: a step's few addresses, many times over
# The native launcher's leading arguments as Triton 3.6 lays them out (grid, stream, function, cooperative grid,
# PDL, global and profile scratch, metadata, launch metadata, enter and exit hooks), which CompiledLaunch passes:
# a Triton whose launcher takes others (3.9 takes the kernel's arguments as one tuple) launches through its own.
NATIVE_LEADING_ARGS = "iiiKKppOOOOOO"


class CompiledLaunch:
    """One compiled kernel, launched through the native launcher Triton built for it, its host tensor
    descriptors encoded once per (address, shape, strides, padding). Where Triton's launcher is not the
    one this knows (another Triton, a kernel with global or profile scratch, a descriptor the compiler
    kept no TMA metadata for), every launch goes through it as `kernel[grid]`'s would."""

    def __init__(self, compiled: Any):
        self.compiled = compiled
        self.native: Callable[..., None] | None = None
        # The descriptor arguments' positions, last first (so expanding one leaves the others' in place),
        # each with its TMA metadata and its memo.
        self.descriptors: list[tuple[int, dict, dict[tuple, list]]] = []
        runner = compiled.run
        encode = getattr(nvidia, "make_tensordesc_arg", None)
        if (not isinstance(runner, nvidia.CudaLauncher) or encode is None
                or getattr(nvidia, "_BASE_ARGS_FORMAT", None) != NATIVE_LEADING_ARGS
                or getattr(runner, "global_scratch_size", 1) or getattr(runner, "profile_scratch_size", 1)):
            return
        launch = runner.launch
        code = getattr(launch, "__code__", None)
        if code is None:  # Triton left the native launcher unwrapped: the kernel takes no descriptor
            self._bind(runner, launch, encode)
            return
        # Triton 3.6 wraps it in a closure over the launcher, the descriptors' positions and their metadata.
        cells = dict(zip(code.co_freevars, launch.__closure__ or (), strict=True))
        try:
            native = cells["launcher"].cell_contents
            positions = sorted(cells["tensordesc_indices"].cell_contents)
            metadata = list(cells["tensordesc_meta"].cell_contents)
        except (KeyError, ValueError, TypeError):
            return
        if len(metadata) != len(positions) or any(meta is None for meta in metadata):
            return
        self.descriptors = [(i, meta, {}) for i, meta in reversed(list(zip(positions, metadata, strict=True)))]
        self._bind(runner, native, encode)

    def _bind(self, runner: Any, native: Callable[..., None], encode: Callable[[Any, dict], list]) -> None:
        self.encode = encode
        self.prefix = (self.compiled.function, runner.launch_cooperative_grid, runner.launch_pdl, None, None,
                       self.compiled.packed_metadata, None, None, None)
        self.native = native

    def launch(self, grid_x: int, grid_y: int, grid_z: int, stream: int, args: list) -> None:
        """Launch on `stream` with the bound arguments `args` (constexprs included, as Triton binds them)."""
        if self.native is None:
            compiled = self.compiled
            compiled.run(grid_x, grid_y, grid_z, stream, compiled.function, compiled.packed_metadata,
                         None, None, None, *args)
            return
        for position, meta, memo in self.descriptors:
            desc = args[position]
            key = (desc.base.data_ptr(), *desc.shape, *desc.strides, desc.padding)
            encoded = memo.get(key)
            if encoded is None:
                if len(memo) >= DESCRIPTORS_KEPT:
                    memo.clear()
                encoded = memo[key] = self.encode(desc, meta)
            args[position:position + 1] = encoded
        self.native(grid_x, grid_y, grid_z, stream, *self.prefix, *args)


def _hooked(hook: Any) -> bool:
    """Whether a Triton launch hook is set: a function, or a HookChain (Triton 3.6+) holding any."""
    return hook is not None and bool(getattr(hook, "calls", True))


def fast_launch(kernel: Any) -> FastLaunch:
    """Decorate a jitted kernel (above @triton.jit) so that its launches skip Triton's per-call work."""
    return FastLaunch(kernel)
