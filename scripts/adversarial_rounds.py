"""Put adversarial and honest candidates through real campaign rounds and print the verdicts.

Each candidate gets a fresh git clone of this repository (which must be a git checkout), a
campaign of one round whose proposer applies that candidate, and the real VALIDATE (subprocess
benchmark with every check) and DECIDE. On a GPU this is the end-to-end proof that a cheat is
rejected and an honest change is accepted.

    PYTHONPATH=. python scripts/adversarial_rounds.py --shapes llama3-8b "id-keyed output cache" honest
"""

from __future__ import annotations

import argparse
import subprocess
import tempfile
from pathlib import Path

import git
import yaml
from rich.console import Console

from agent.manifest import parse_manifest
from agent.runner import Campaign
from harness.files import REPO_ROOT
from harness.shapes import load_shapes
from tests.adversarial.cheats import CHEATS, Candidate, replace
from tests.adversarial.test_adversarial import ScriptedProposer

# A known-worse starting point for the honest candidate, so that its gain is real on any GPU:
# 64-wide output tiles for large dense GEMMs, which the honest patch restores to 256.
DETUNE = replace('"large": {"BLOCK_M": 128, "BLOCK_N": 256', '"large": {"BLOCK_M": 128, "BLOCK_N": 64')
HONEST = Candidate("honest: 256-wide tiles for large GEMMs", "gemm", {"kernels/gemm/tuning.py": replace(
    '"large": {"BLOCK_M": 128, "BLOCK_N": 64', '"large": {"BLOCK_M": 128, "BLOCK_N": 256')}, "ACCEPT", "")


def run(candidate: Candidate, shapes: str, work: Path, console: Console) -> None:
    clone = work / candidate.name.replace(" ", "-").replace(":", "")
    subprocess.run(["git", "clone", "-q", str(REPO_ROOT), str(clone)], check=True)
    repo = git.Repo(clone)
    shape_file = clone / "campaign-shapes.yaml"
    shape_file.write_text(yaml.safe_dump([s.model_dump(mode="json") for s in load_shapes("dense_gemm", shapes)]))
    if candidate is HONEST:
        tuning = clone / "kernels/gemm/tuning.py"
        tuning.write_text(DETUNE(tuning.read_text()))
    repo.git.add(A=True)
    repo.git.commit("-m", "campaign start", "--author", "demo <demo@turbo-opt>")
    manifest = parse_manifest({"campaign": "adversarial", "op": candidate.op, "shapes": "campaign-shapes.yaml",
                               "max_iterations": 1, "repeats": 20}, "demo")
    campaign = Campaign.create(clone, manifest, console=console, proposer=ScriptedProposer([candidate]))
    campaign.run()
    (record,) = campaign.state.optimization_rounds()
    console.print(f"[bold]{candidate.name}[/]: {record.status}: {record.reason}", highlight=False)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("names", nargs="+", help='cheat names from tests/adversarial/cheats.py, or "honest"')
    parser.add_argument("--shapes", default="smoke", help="dense GEMM preset for the campaigns")
    args = parser.parse_args()
    by_name = {c.name: c for c in CHEATS} | {"honest": HONEST}
    console = Console(width=200)
    with tempfile.TemporaryDirectory() as work:
        for name in args.names:
            run(by_name[name], args.shapes, Path(work), console)


if __name__ == "__main__":
    main()
