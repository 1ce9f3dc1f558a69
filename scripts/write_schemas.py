"""Write the JSON schemas of what the runner hands out and reads back, for agents to code against:

    python scripts/write_schemas.py        # docs/schemas/*.schema.json (tests check they are current)
"""

from __future__ import annotations

import json
from pathlib import Path

from pydantic import BaseModel

from agent.decision import DecisionRecord
from agent.request import Request
from agent.state import Proposal
from agent.status import CampaignStatus
from harness.files import REPO_ROOT, atomic_write_text

DOCS = REPO_ROOT / "docs" / "schemas"
SCHEMAS: dict[str, tuple[type[BaseModel], Path]] = {
    name: (model, DOCS / f"{name}.schema.json")
    for name, model in {"request": Request, "proposal": Proposal, "decision": DecisionRecord,
                        "status": CampaignStatus}.items()
}


def schema_text(model: type[BaseModel]) -> str:
    return json.dumps(model.model_json_schema(), indent=2, sort_keys=True) + "\n"


def main() -> None:
    for model, path in SCHEMAS.values():
        atomic_write_text(path, schema_text(model))
        print(f"wrote {path.relative_to(REPO_ROOT)}")


if __name__ == "__main__":
    main()
