"""VALIDATE's A/B pairs: which side is measured first alternates from one repeat to the next."""

from pathlib import Path

import torch

from agent.bench import BenchRequest
from agent.manifest import parse_manifest
from agent.state import RoundRecord
from agent.validation import validate
from harness.meta import BenchMeta, TimingInfo, environment, write_meta
from harness.schema import GEMM, read_summary, write_summary
from tests.test_schema import gemm_row


class Tree:
    def __init__(self) -> None:
        self.at, self.order = "", []

    def at_best(self) -> None:
        self.at = "best"

    def at_candidate(self, number: int) -> None:
        self.at = "candidate"

    def focused_test(self, log) -> str | None:
        self.order.append(f"test {self.at}")
        return None

    def bench(self, request: BenchRequest, what: str):
        self.order.append(self.at)
        rate = 110.0 if self.at == "candidate" else 100.0
        write_summary(request.summary_csv, GEMM, [gemm_row("s1", fwd=rate, bwd=rate)])
        write_meta(request.summary_csv, BenchMeta(
            op="gemm", runner="fake", csv_schema="gemm", dtype="fp16", variant="default", shapes="t", seed=0,
            timing=TimingInfo(mode="fake", repeats=1, warmup=0, l2_flush=False), **environment(torch.device("cpu"))))
        return read_summary(request.summary_csv)


def test_the_pairs_alternate_which_side_goes_first(tmp_path: Path):
    manifest = parse_manifest({"campaign": "ab", "op": "gemm", "shapes": "smoke", "representative_shapes": ["s1"]},
                              "test")
    (tmp_path / "rounds" / "round-2" / "artifacts").mkdir(parents=True)
    record, tree = RoundRecord(number=2), Tree()
    for _ in range(3):
        found = validate(record, tmp_path, manifest, tree.bench, tree)
        record.measurements.append(found.candidate)
        record.references.append(found.reference)
    # The focused test runs once, on the candidate, before its first measurement.
    assert tree.order == ["test candidate", "candidate", "best", "best", "candidate", "candidate", "best"]
    assert [m.per_shape["s1"] for m in record.measurements] == [110.0, 110.0, 110.0]
    assert [m.per_shape["s1"] for m in record.references] == [100.0, 100.0, 100.0]
    assert [m.csv for m in record.references] == [f"rounds/round-2/artifacts/reference{s}.csv"
                                                  for s in ("", ".remeasure-1", ".remeasure-2")]
