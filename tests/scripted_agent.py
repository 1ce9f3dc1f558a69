"""A scripted coding agent for `command` campaigns in tests: `python -m tests.scripted_agent PLAN.json`.

PLAN maps a round number to what the agent does in that round (the runner gives the round in
TURBO_OPT_ROUND, the request on stdin, the proposal path in TURBO_OPT_PROPOSAL):
  {"candidate": NAME}     apply that candidate of tests/adversarial/cheats.py (a cheat, or HONEST)
  {"replace": [PATH, OLD, NEW], "name": NAME}
                          replace the text OLD by NEW in PATH (relative to the checkout it works in)
  {"exit": CODE}          crash with that status after printing a line
  {"sleep": SECONDS}      hang (with a grandchild in its process group that must die with it)
  {"proposal": false}     with "candidate": edit as asked but write no proposal.json
  {"proposal_only": true} change nothing and propose it anyway
A round absent from the plan changes nothing and proposes nothing.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
import time
from pathlib import Path

from tests.adversarial.cheats import CANDIDATES


def main() -> int:
    plan = json.loads(Path(sys.argv[1]).read_text())
    step = plan.get(os.environ["TURBO_OPT_ROUND"], {})
    request = sys.stdin.read()
    assert "propose one change" in request, "the request did not arrive on stdin"
    if "exit" in step:
        print("scripted agent: simulated crash", flush=True)
        return step["exit"]
    if "sleep" in step:
        sleeper = subprocess.Popen(["sleep", str(step["sleep"])])
        Path(os.environ["TURBO_OPT_ROUND_DIR"], "sleeper.pid").write_text(str(sleeper.pid))
        time.sleep(step["sleep"])
        return 0
    if "candidate" in step:
        candidate = CANDIDATES[step["candidate"]]
        candidate.apply(Path(os.environ["TURBO_OPT_ROOT"]))
        name = candidate.name
    elif "replace" in step:
        path, old, new = step["replace"]
        target = Path(os.environ["TURBO_OPT_ROOT"]) / path
        text = target.read_text()
        assert old in text, f"scripted agent: {old!r} is not in {target}"
        target.write_text(text.replace(old, new))
        name = step["name"]
    elif step.get("proposal_only"):
        name = "nothing at all"
    else:
        return 0
    if step.get("proposal", True):
        Path(os.environ["TURBO_OPT_PROPOSAL"]).write_text(json.dumps(
            {"hypothesis": f"scripted: {name}", "summary": name[:200], "risk": "low"}))
    return 0


if __name__ == "__main__":
    sys.exit(main())
