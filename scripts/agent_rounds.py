"""A real `command` campaign driven by the scripted agent (tests/scripted_agent.py), in a throwaway
clone: the end-to-end proof, on a GPU, that honest kernel changes are accepted and cheats rejected.

The clone starts from this working tree with `--start` patches committed (e.g. a kernel without its
TMA dispatch), then the agent proposes `--plan` candidates of tests/adversarial/cheats.py, one per
round, through the real CLI (`turbo-opt start --manifest ...`). The campaign's directory (report,
requests, decisions, summaries, benchmarks) is copied to `--out`, and each round's verdict printed.

    PYTHONPATH=. python scripts/agent_rounds.py --op gemm --shapes llama3-8b --start "without TMA dispatch" \\
        --plan "honest: TMA dispatch restored" "grad-mode dependent result" --out agent-rounds
"""

from __future__ import annotations

import argparse
import json
import shutil
import subprocess
import sys
import tempfile
import time
from pathlib import Path

import git
import yaml

from agent.state import load_state
from tests.adversarial.cheats import CANDIDATES
from tests.clones import AUTHOR, clone_worktree


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--op", default="gemm")
    parser.add_argument("--shapes", default="smoke", help="a preset of the op, or a YAML shape file")
    parser.add_argument("--start", nargs="*", default=[], help="candidates committed before the campaign starts")
    parser.add_argument("--plan", nargs="+", required=True, help="the agent's candidates, one per round")
    parser.add_argument("--repeats", type=int, default=20)
    parser.add_argument("--metric", default="step", choices=("forward", "backward", "step"))
    parser.add_argument("--out", type=Path, required=True, help="where the campaign directory is copied")
    args = parser.parse_args()
    with tempfile.TemporaryDirectory() as work:
        root = clone_worktree(Path(work) / "clone")
        shapes = args.shapes
        if Path(shapes).is_file():
            shutil.copy(shapes, root / "campaign-shapes.yaml")
            shapes = "campaign-shapes.yaml"
        for name in args.start:
            CANDIDATES[name].apply(root)
        plan = {str(number): {"candidate": name} for number, name in enumerate(args.plan, start=2)}
        (Path(work) / "plan.json").write_text(json.dumps(plan))
        manifest = {"campaign": "agent", "op": args.op, "shapes": shapes, "max_iterations": len(args.plan),
                    "repeats": args.repeats, "primary_metric": args.metric,
                    "proposer": {"kind": "command", "run": f"{sys.executable} -m tests.scripted_agent {work}/plan.json",
                                 "timeout_min": 5}}
        (root / "agent-manifest.yaml").write_text(yaml.safe_dump(manifest))
        repo = git.Repo(root)
        repo.git.add(A=True)
        repo.git.commit("-q", "-m", f"campaign start: {', '.join(args.start) or 'as is'}", AUTHOR)
        started = time.monotonic()
        result = subprocess.run([sys.executable, "-m", "agent", "start", "--manifest", "agent-manifest.yaml"], cwd=root,
                                text=True, capture_output=True)
        print(result.stdout[-4000:], result.stderr[-4000:], sep="\n")
        run = root / "campaigns" / "runs" / "agent"
        if run.exists():
            shutil.copytree(run, args.out, dirs_exist_ok=True)
            state = load_state(run / "state.json")
            for r in state.optimization_rounds():
                gain = f"{r.gain_pct:+.2f}%" if r.gain_pct is not None else "n/a"
                fresh = f"{r.fresh_gain_pct:+.2f}%" if r.fresh_gain_pct is not None else "n/a"
                print(f"round {r.number} [{r.summary}]: {r.status} (gain {gain}, fresh tensors {fresh}, "
                      f"{r.elapsed_s:.0f} s): {r.reason}")
        print(f"campaign wall time {time.monotonic() - started:.0f} s; exit {result.returncode}")


if __name__ == "__main__":
    main()
