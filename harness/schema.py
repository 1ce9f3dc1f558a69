"""Summary CSV schemas: the frozen GEMM-class header, a way for other ops to declare theirs, and a
reader that refuses any file whose header is not exactly a declared schema.

A header is `label, <dims>, Check, Forward <metric>, Forward <metric>_stddev, Backward <metric>,
Backward <metric>_stddev, Forward Time (ms), Backward Time (ms), <output>_snr...`. Metadata never
goes into the CSV: it goes to the JSON sidecar.
"""

from __future__ import annotations

import io
import os
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from pathlib import Path

import pandas as pd

from harness.errors import UserError
from harness.files import atomic_write_text

PASS, FAIL = "PASS", "FAIL"

GEMM_HEADER = (
    "label,B,M,N,K,Check,Forward TFLOPS,Forward TFLOPS_stddev,Backward TFLOPS,Backward TFLOPS_stddev,"
    "Forward Time (ms),Backward Time (ms),out_snr,da_snr,db_snr"
)


TFLOPS, GBPS = "TFLOPS", "GB/s"
# Work per second in each metric's unit: FLOPs / 1e12, bytes moved / 1e9.
METRIC_UNITS: dict[str, float] = {TFLOPS: 1e12, GBPS: 1e9}


@dataclass(frozen=True)
class CsvSchema:
    name: str
    dims: tuple[str, ...]
    # TFLOPS for compute-bound ops (the rate of spec.flops), GB/s for memory-bound ones (spec.bytes_moved).
    metric: str
    outputs: tuple[str, ...]
    # Dims a shape may leave out (e.g. B=1 for a dense GEMM).
    dim_defaults: Mapping[str, int] = field(default_factory=dict)

    def __post_init__(self) -> None:
        if self.metric not in METRIC_UNITS:
            raise ValueError(f"schema '{self.name}': metric must be one of {', '.join(METRIC_UNITS)}, "
                             f"got {self.metric!r}")

    @property
    def counts_bytes(self) -> bool:
        """Whether the metric is a bandwidth (bytes moved) rather than a FLOP rate."""
        return self.metric == GBPS

    @property
    def unit(self) -> float:
        return METRIC_UNITS[self.metric]

    @property
    def fwd_metric(self) -> str:
        return f"Forward {self.metric}"

    @property
    def bwd_metric(self) -> str:
        return f"Backward {self.metric}"

    fwd_ms = "Forward Time (ms)"
    bwd_ms = "Backward Time (ms)"

    @property
    def snr_columns(self) -> tuple[str, ...]:
        return tuple(f"{out}_snr" for out in self.outputs)

    @property
    def columns(self) -> tuple[str, ...]:
        return (
            "label", *self.dims, "Check",
            self.fwd_metric, f"{self.fwd_metric}_stddev",
            self.bwd_metric, f"{self.bwd_metric}_stddev",
            self.fwd_ms, self.bwd_ms,
            *self.snr_columns,
        )

    @property
    def header(self) -> str:
        return ",".join(self.columns)

    @property
    def numeric_columns(self) -> tuple[str, ...]:
        return self.columns[len(self.dims) + 2 :]

    def resolve_dims(self, dims: Mapping[str, int], where: str) -> dict[str, int]:
        """The schema's dims, in order, from a shape's dims (defaults filled, extras refused)."""
        merged = {**self.dim_defaults, **dims}
        missing = [d for d in self.dims if d not in merged]
        extra = [d for d in merged if d not in self.dims]
        if missing or extra:
            raise UserError(f"{where}: dims must be {list(self.dims)}; missing {missing}, unexpected {extra}")
        return {d: merged[d] for d in self.dims}


GEMM = CsvSchema("gemm", ("B", "M", "N", "K"), TFLOPS, ("out", "da", "db"), dim_defaults={"B": 1})
if GEMM.header != GEMM_HEADER:  # the frozen contract: fail at import, never write a drifted header
    raise RuntimeError("harness.schema: the GEMM schema no longer produces the frozen header")

SCHEMAS: dict[str, CsvSchema] = {GEMM.name: GEMM}

# Attention: q/k head dim D and v head dim Dv (they differ for MLA), causal 0/1, window the keys left of the
# diagonal a query sees (0: none); a shape may leave causal and window out.
ATTENTION_HEADER = (
    "label,B,Hq,Hkv,Sq,Sk,D,Dv,causal,window,Check,Forward TFLOPS,Forward TFLOPS_stddev,Backward TFLOPS,"
    "Backward TFLOPS_stddev,Forward Time (ms),Backward Time (ms),out_snr,dq_snr,dk_snr,dv_snr"
)


def register_schema(schema: CsvSchema) -> CsvSchema:
    """Declare another op family's schema. Re-registering a name with other columns is refused."""
    known = SCHEMAS.get(schema.name)
    if known is not None and known.columns != schema.columns:
        raise ValueError(f"schema '{schema.name}' is already declared with other columns")
    SCHEMAS[schema.name] = schema
    return schema


ATTENTION = register_schema(CsvSchema(
    "attention", ("B", "Hq", "Hkv", "Sq", "Sk", "D", "Dv", "causal", "window"), TFLOPS, ("out", "dq", "dk", "dv"),
    dim_defaults={"causal": 0, "window": 0},
))
if ATTENTION.header != ATTENTION_HEADER:
    raise RuntimeError("harness.schema: the attention schema no longer produces the frozen header")


# The memory-bound MoE ops (kernels/moe), in GB/s. Permute and unpermute: T tokens of hidden size H, E
# experts, topk copies a token, each expert's rows padded to pad_to; permute's outputs are the permuted
# tokens and probabilities, unpermute's the combined tokens. The router: T tokens over E experts, topk,
# group-limited (n_group, topk_group; 1, 1 without groups), scores by sigmoid (1) or softmax (0).
MOE_PERMUTE_HEADER = (
    "label,T,H,E,topk,pad_to,Check,Forward GB/s,Forward GB/s_stddev,Backward GB/s,Backward GB/s_stddev,"
    "Forward Time (ms),Backward Time (ms),out_snr,out_probs_snr,dx_snr,dprobs_snr"
)
MOE_UNPERMUTE_HEADER = (
    "label,T,H,E,topk,pad_to,Check,Forward GB/s,Forward GB/s_stddev,Backward GB/s,Backward GB/s_stddev,"
    "Forward Time (ms),Backward Time (ms),out_snr,dh_snr,dprobs_snr"
)
MOE_ROUTER_HEADER = (
    "label,T,E,topk,n_group,topk_group,sigmoid,Check,Forward GB/s,Forward GB/s_stddev,Backward GB/s,"
    "Backward GB/s_stddev,Forward Time (ms),Backward Time (ms),probs_snr,aux_loss_snr,z_loss_snr,dlogits_snr"
)
MOE_TOKEN_DIMS = ("T", "H", "E", "topk", "pad_to")
MOE_PERMUTE = register_schema(CsvSchema("moe_permute", MOE_TOKEN_DIMS, GBPS, ("out", "out_probs", "dx", "dprobs"),
                                        dim_defaults={"pad_to": 1}))
MOE_UNPERMUTE = register_schema(CsvSchema("moe_unpermute", MOE_TOKEN_DIMS, GBPS, ("out", "dh", "dprobs"),
                                          dim_defaults={"pad_to": 1}))
MOE_ROUTER = register_schema(CsvSchema(
    "moe_router", ("T", "E", "topk", "n_group", "topk_group", "sigmoid"), GBPS,
    ("probs", "aux_loss", "z_loss", "dlogits"), dim_defaults={"n_group": 1, "topk_group": 1, "sigmoid": 0},
))
# The layer's experts (moe_mlp): TFLOPS of the expert GEMMs; I the expert intermediate size.
MOE_MLP_HEADER = (
    "label,T,H,I,E,topk,Check,Forward TFLOPS,Forward TFLOPS_stddev,Backward TFLOPS,Backward TFLOPS_stddev,"
    "Forward Time (ms),Backward Time (ms),out_snr,dx_snr,dprobs_snr,dw_gate_up_snr,dw_down_snr"
)
MOE_MLP = register_schema(CsvSchema("moe_mlp", ("T", "H", "I", "E", "topk"), TFLOPS,
                                    ("out", "dx", "dprobs", "dw_gate_up", "dw_down")))
for _schema, _header in ((MOE_PERMUTE, MOE_PERMUTE_HEADER), (MOE_UNPERMUTE, MOE_UNPERMUTE_HEADER),
                         (MOE_ROUTER, MOE_ROUTER_HEADER), (MOE_MLP, MOE_MLP_HEADER)):
    if _schema.header != _header:
        raise RuntimeError(f"harness.schema: the {_schema.name} schema no longer produces the frozen header")


def schema_of_header(header: str, name: str) -> CsvSchema | None:
    """The schema a header follows by the convention (`label, <dims>, Check, Forward <metric>, ...,
    <output>_snr...`), named `name`; None if it does not. For a kernel outside turbo-opt whose CSV no
    declared schema describes."""
    columns = header.strip().split(",")
    if columns[0] != "label" or "Check" not in columns:
        return None
    check = columns.index("Check")
    after = columns[check + 1:]
    if not after or not after[0].startswith("Forward "):
        return None
    outputs = tuple(c.removesuffix("_snr") for c in after if c.endswith("_snr"))
    schema = CsvSchema(name, tuple(columns[1:check]), after[0].removeprefix("Forward "), outputs)
    return schema if outputs and _holds(columns, schema) else None


def get_schema(name: str) -> CsvSchema:
    try:
        return SCHEMAS[name]
    except KeyError:
        raise UserError(f"unknown CSV schema '{name}' (declared: {', '.join(SCHEMAS)})") from None


# The name of a schema read from a header that follows the convention but that no op declares.
UNDECLARED = "undeclared"

# The label a summary writer gives a shape that failed before it had one (kernel-optimize's
# quick_test_bench.py): such rows are failures, not shapes that can be matched across files.
UNLABELED = "?"


@dataclass(frozen=True)
class Summary:
    """A validated summary CSV: one row per shape, labels unique. Columns beside the schema's are kept
    out of the frame (named in `extra_columns`); FAIL rows labelled "?" are counted in
    `unlabeled_failures`, not kept as shapes."""

    path: Path
    schema: CsvSchema
    frame: pd.DataFrame
    extra_columns: tuple[str, ...] = ()
    unlabeled_failures: int = 0

    @property
    def labels(self) -> list[str]:
        return list(self.frame["label"])

    def metric(self, which: str) -> pd.Series:
        """Per-shape metric by label: "forward", "backward", or "step" (fwd+bwd work over fwd+bwd time).

        step = (F*Tf + B*Tb) / (Tf + Tb) is the total work over the total time; for GEMM-class rows
        it equals 6*B*M*N*K / (fwd ms + bwd ms).
        """
        f = self.frame.set_index("label")
        s = self.schema
        if which == "forward":
            return f[s.fwd_metric]
        if which == "backward":
            return f[s.bwd_metric]
        if which == "step":
            work = f[s.fwd_metric] * f[s.fwd_ms] + f[s.bwd_metric] * f[s.bwd_ms]
            return work / (f[s.fwd_ms] + f[s.bwd_ms])
        raise UserError(f"unknown metric '{which}' (use forward, backward or step)")

    def checks(self) -> pd.Series:
        return self.frame.set_index("label")["Check"]


def write_summary(path: str | os.PathLike[str], schema: CsvSchema, rows: Sequence[Mapping[str, object]]) -> Path:
    """Write rows (dicts keyed by the schema's columns) with the exact header, atomically."""
    for row in rows:
        if tuple(row) != schema.columns:
            raise ValueError(f"row keys {list(row)} are not the '{schema.name}' columns {list(schema.columns)}")
    frame = pd.DataFrame(list(rows), columns=list(schema.columns))
    body = frame.to_csv(header=False, index=False, na_rep="nan", float_format="%.6g", lineterminator="\n")
    return atomic_write_text(path, schema.header + "\n" + body)


def _header_problem(got: list[str], schema: CsvSchema) -> str:
    expected = list(schema.columns)
    for i, (g, e) in enumerate(zip(got, expected, strict=False)):
        if g != e:
            return f"column {i + 1} is '{g}', expected '{e}'"
    return f"it has {len(got)} columns, the schema has {len(expected)}"


def _holds(got: list[str], schema: CsvSchema) -> bool:
    """Whether a header holds every column of the schema, in the schema's order (others between them)."""
    rest = iter(got)
    return all(column in rest for column in schema.columns)


def read_summary(path: str | os.PathLike[str], schema: CsvSchema | None = None, infer: bool = False) -> Summary:
    """Read and validate a summary CSV; `schema=None` accepts any declared schema whose columns it holds,
    and with `infer` also a header no declared schema describes that follows the convention (the CSV of
    a kernel outside turbo-opt).

    Also read as other writers of the frozen schema write it (kernel-optimize's quick_test_bench.py):
    CRLF line endings, extra columns beside the schema's (ignored, named in `extra_columns`), `nan` and
    `inf` values, and FAIL rows labelled "?" (counted as unlabeled failures)."""
    path = Path(path)
    try:
        text = path.read_text(encoding="utf-8").replace("\r\n", "\n")
    except (OSError, UnicodeDecodeError) as exc:
        reason = exc.strerror if isinstance(exc, OSError) else "not UTF-8 text"
        raise UserError(f"{path}: cannot read: {reason}") from None
    header_line = text.split("\n", 1)[0]
    got = header_line.split(",")
    candidates = [schema] if schema else list(SCHEMAS.values())
    matched = next((s for s in candidates if s.header == header_line), None) \
        or next((s for s in candidates if _holds(got, s)), None) \
        or (schema_of_header(header_line, UNDECLARED) if infer and schema is None else None)
    if matched is None:
        closest = max(candidates, key=lambda s: sum(a == b for a, b in zip(got, s.columns, strict=False)))
        raise UserError(f"{path}: header is not the '{closest.name}' schema: {_header_problem(got, closest)}")

    frame = pd.read_csv(io.StringIO(text), dtype={"label": str}, keep_default_na=False,
                        na_values=["nan", "NaN", ""])
    extra = tuple(c for c in frame.columns if c not in matched.columns)
    frame = frame[list(matched.columns)]
    bad_check = frame.index[~frame["Check"].isin([PASS, FAIL])]
    if len(bad_check):
        i = bad_check[0]
        raise UserError(f"{path}: row {i + 1}: column 'Check' is '{frame.at[i, 'Check']}', expected PASS or FAIL")
    for col in (*matched.dims, *matched.numeric_columns):
        values = pd.to_numeric(frame[col], errors="coerce")
        bad = frame.index[values.isna() & frame[col].notna()]
        if len(bad):
            i = bad[0]
            raise UserError(f"{path}: row {i + 1}: column '{col}' is '{frame.at[i, col]}', not a number")
        frame[col] = values
    unlabeled = (frame["label"] == UNLABELED) & (frame["Check"] == FAIL)
    frame = frame[~unlabeled].reset_index(drop=True)
    dupes = frame["label"][frame["label"].duplicated()]
    if len(dupes):
        raise UserError(f"{path}: label '{dupes.iloc[0]}' appears more than once")
    return Summary(path=path, schema=matched, frame=frame, extra_columns=extra,
                   unlabeled_failures=int(unlabeled.sum()))
