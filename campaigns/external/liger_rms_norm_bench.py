"""The benchmark a Liger-Kernel checkout gets for a turbo-opt campaign on its RMSNorm (scripts/liger_repo.sh
copies it in as bench_turbo_opt.py): `python bench_turbo_opt.py OUT.csv SHAPES.yaml` writes the frozen
summary CSV the way kernel-optimize's quick_test_bench.py does (csv.DictWriter, Python float reprs, CRLF).

Per shape (M rows of hidden size N, bf16, Llama casting): forward and backward of LigerRMSNormFunction
checked by SNR against float64 on fresh random inputs (NaN or Inf anywhere is a FAIL), then timed with CUDA
events (triton.testing.do_bench, L2 flushed between calls). GB/s counts the bytes each pass must move:
forward reads X and W and writes Y and the fp32 rstd; backward reads dY, X, W and rstd and writes dX and
dW (its per-program fp32 partials are the kernel's own business).
"""

import csv
import math
import statistics
import sys

import torch
import triton
import yaml
from liger_kernel.ops.rms_norm import LigerRMSNormFunction

COLUMNS = ["label", "M", "N", "Check", "Forward GB/s", "Forward GB/s_stddev", "Backward GB/s", "Backward GB/s_stddev",
           "Forward Time (ms)", "Backward Time (ms)", "y_snr", "dx_snr", "dw_snr"]
EPS = 1e-6
MIN_SNR_DB = 40.0  # bf16 outputs


def snr_db(test: torch.Tensor, ref: torch.Tensor) -> float:
    test, ref = test.double(), ref.double()
    if not torch.isfinite(test).all():
        return -math.inf
    noise = float(((test - ref) ** 2).sum())
    return math.inf if noise == 0 else 10 * math.log10(float((ref ** 2).sum()) / noise)


def reference(x, w, dy):
    x64, w64 = x.double().requires_grad_(), w.double().requires_grad_()
    y = x64 * torch.rsqrt(x64.pow(2).mean(-1, keepdim=True) + EPS) * w64
    y.backward(dy.double())
    return y.detach(), x64.grad, w64.grad


def rates(nbytes: float, times_ms: list[float]) -> tuple[float, float, float]:
    """(GB/s at the median time, its stddev over the calls, median ms)."""
    each = [nbytes / (t * 1e-3) / 1e9 for t in times_ms]
    median = statistics.median(times_ms)
    return nbytes / (median * 1e-3) / 1e9, statistics.stdev(each) if len(each) > 1 else 0.0, median


def measure(label: str, m: int, n: int) -> dict:
    torch.manual_seed(m * 131 + n)
    x = torch.randn(m, n, device="cuda", dtype=torch.bfloat16, requires_grad=True)
    w = (1.0 + 0.1 * torch.randn(n, device="cuda", dtype=torch.bfloat16)).requires_grad_()
    dy = torch.randn(m, n, device="cuda", dtype=torch.bfloat16)
    y = LigerRMSNormFunction.apply(x, w, EPS, 0.0, "llama", False)
    y.backward(dy)
    y_ref, dx_ref, dw_ref = reference(x.detach(), w.detach(), dy)
    snrs = [snr_db(y, y_ref), snr_db(x.grad, dx_ref), snr_db(w.grad, dw_ref)]
    forward = lambda: LigerRMSNormFunction.apply(x, w, EPS, 0.0, "llama", False)  # noqa: E731
    out = forward()
    backward = lambda: out.backward(dy, retain_graph=True)  # noqa: E731
    fwd_times = triton.testing.do_bench(forward, return_mode="all")
    bwd_times = triton.testing.do_bench(backward, grad_to_none=[x, w], return_mode="all")
    element = x.element_size()
    fwd = rates(2 * m * n * element + n * element + 4 * m, fwd_times)
    bwd = rates(3 * m * n * element + 2 * n * element + 4 * m, bwd_times)
    return {"label": label, "M": m, "N": n, "Check": "PASS" if min(snrs) >= MIN_SNR_DB else "FAIL",
            "Forward GB/s": fwd[0], "Forward GB/s_stddev": fwd[1], "Backward GB/s": bwd[0],
            "Backward GB/s_stddev": bwd[1], "Forward Time (ms)": fwd[2], "Backward Time (ms)": bwd[2],
            "y_snr": snrs[0], "dx_snr": snrs[1], "dw_snr": snrs[2]}


def main() -> None:
    with open(sys.argv[2]) as f:
        shapes = yaml.safe_load(f)["shapes"]
    rows = []
    for shape in shapes:
        dims = shape.get("dims", shape)
        try:
            rows.append(measure(shape["label"], dims["M"], dims["N"]))
        except Exception as exc:  # one shape's failure is a FAIL row, not a crash
            print(f"{shape['label']}: {type(exc).__name__}: {exc}", file=sys.stderr)
            rows.append({c: math.nan for c in COLUMNS} | {"label": shape["label"], "M": dims["M"], "N": dims["N"],
                                                         "Check": "FAIL"})
    with open(sys.argv[1], "w", newline="") as f:
        writer = csv.DictWriter(f, fieldnames=COLUMNS)
        writer.writeheader()
        writer.writerows(rows)


if __name__ == "__main__":
    main()
