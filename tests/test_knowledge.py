"""The knowledge base: its check (on the real tree and on planted problems), routing, tips and the CLI."""

import json
import shutil
from pathlib import Path

import git
import pytest
import typer
import yaml
from typer.testing import CliRunner

from agent.knowledge import (
    Tip,
    applicable,
    check_knowledge,
    curated_tips,
    knowledge_files,
    load_tips,
    read_knowledge_file,
    tip_files,
    write_tips,
)
from agent.knowledge_cli import app, register
from harness.errors import UserError
from harness.files import REPO_ROOT

H100 = "NVIDIA H100 80GB HBM3"
MISSING_SHA = "0123abc"  # in no history: `git cat-file -e 0123abc^{commit}` fails
HOPPER = ["knowledge/hardware/hopper/overview.md", "knowledge/hardware/hopper/kernel-implementation-notes.md"]
TRITON = ["knowledge/backend/triton/programming-model.md", "knowledge/backend/triton/optimization-directions.md"]
GLUON = ["knowledge/backend/gluon/programming-model.md", "knowledge/backend/gluon/optimization-directions.md"]
GROUPED_FP8 = ["knowledge/ops/grouped_gemm_fp8/overview.md",
               "knowledge/ops/grouped_gemm_fp8/optimization-directions.md"]

runner = CliRunner()


def tip(**changes: object) -> Tip:
    fields = {"op": "gemm", "backend": "triton", "device": H100, "variant": "default", "shape_class": "square",
              "summary": "large bucket num_stages 3 -> 4", "outcome": "ROLLBACK", "gain_pct": -2.0,
              "reason": "slower", "commit": "48af216"}
    return Tip(**(fields | changes))


@pytest.fixture
def tree(tmp_path: Path) -> Path:
    """A writable copy of knowledge/ over the real repository: every other top-level entry a symlink, the
    history shared through a `.git` file (so evidence commits resolve, and nothing of the repo is written)."""
    root = tmp_path / "repo"
    root.mkdir()
    for entry in REPO_ROOT.iterdir():
        if entry.name not in (".git", "knowledge"):
            (root / entry.name).symlink_to(entry)
    shutil.copytree(REPO_ROOT / "knowledge", root / "knowledge")
    (root / ".git").write_text(f"gitdir: {git.Repo(REPO_ROOT).git_dir}\n")
    return root


def edit(path: Path, old: str, new: str) -> None:
    text = path.read_text()
    assert old in text, f"{old!r} not in {path}"
    path.write_text(text.replace(old, new, 1))


def plant_problems(root: Path) -> list[str]:
    """Break the copied knowledge base in known ways; returns the lines the check must print, exactly."""
    kb = root / "knowledge"
    write_tips(kb / "tips" / "no_such_op.yaml", [tip(op="no_such_op")])
    (kb / "tips" / "gemm.yaml").write_text(yaml.safe_dump({"tips": [tip().model_dump(exclude={"reason"})]}))
    write_tips(kb / "tips" / "grouped_gemm.yaml", [tip(op="grouped_gemm", commit=MISSING_SHA)])
    edit(kb / "backend" / "gluon" / "programming-model.md", "## Pitfalls\n", "## Traps\n")
    edit(kb / "ops" / "gemm" / "overview.md", "  - commit: 48af216\n", f"  - commit: {MISSING_SHA}\n")
    edit(kb / "ops" / "gemm_fp8" / "overview.md", "evidence:\n",
         "evidence:\n  - command: turbo-opt bench --op no_such_op\n")
    directions = kb / "ops" / "gemm" / "optimization-directions.md"
    # Did not work is the last section: one vague bullet, and one whose figure is on its continuation line (fine).
    directions.write_text(directions.read_text()
                          + "- Something vague that helped nobody\n- Vague at first,\n  then 12 TFLOPS\n")
    (kb / "ops" / "grouped_gemm" / "optimization-directions.md").unlink()
    misplaced = (kb / "hardware" / "hopper" / "overview.md").read_text()
    (kb / "backend" / "triton" / "hopper-notes.md").write_text(misplaced)
    return [
        "knowledge/tips/no_such_op.yaml: tip 1: unknown op 'no_such_op'",
        "knowledge/tips/gemm.yaml: tips.0.reason: Field required",
        f"knowledge/tips/grouped_gemm.yaml: tip 1: commit {MISSING_SHA} is not in this repository's history",
        "knowledge/backend/gluon/programming-model.md: missing section '## Pitfalls'",
        f"knowledge/ops/gemm/overview.md: evidence commit {MISSING_SHA} is not in this repository's history",
        "knowledge/ops/gemm_fp8/overview.md: evidence command 'turbo-opt bench --op no_such_op': unknown op "
        "'no_such_op'",
        "knowledge/ops/gemm/optimization-directions.md: a '## Did not work' bullet has no measured figure: "
        "- Something vague that helped nobody",
        "knowledge/ops/grouped_gemm/optimization-directions.md: missing",
        "knowledge/backend/triton/hopper-notes.md: kind 'hardware' does not match its folder backend/ (kind "
        "'backend')",
        "knowledge/backend/triton/hopper-notes.md: subject 'hopper' does not match its folder 'triton'",
    ]


def test_the_knowledge_base_checks_clean() -> None:
    assert check_knowledge(REPO_ROOT) == []


def test_the_copied_tree_checks_clean_too(tree: Path) -> None:
    assert check_knowledge(tree) == []


def test_check_names_every_planted_problem(tree: Path) -> None:
    expected = plant_problems(tree)
    assert sorted(check_knowledge(tree)) == sorted(expected)


def test_check_refuses_files_outside_the_layout_and_without_front_matter(tree: Path) -> None:
    (tree / "knowledge" / "triton").mkdir()
    (tree / "knowledge" / "triton" / "hopper.md").write_text("# old notes\n")
    (tree / "knowledge" / "ops" / "gemm" / "notes.md").write_text("# no front matter\n")
    assert check_knowledge(tree) == [
        "knowledge/ops/gemm/notes.md: does not open with YAML front matter (a '---' line)",
        "knowledge/triton/hopper.md: outside the layout (knowledge/hardware|backend|ops/<subject>/<name>.md)",
    ]
    with pytest.raises(UserError, match=r"^knowledge/ops/gemm/notes.md: does not open with YAML front matter"):
        read_knowledge_file(tree / "knowledge" / "ops" / "gemm" / "notes.md", tree)


def test_check_command_exits_1_on_problems_and_0_when_all_good(tree: Path) -> None:
    good = runner.invoke(app, ["check", "--root", str(REPO_ROOT)])
    assert good.exit_code == 0, good.output
    files, tips = len(knowledge_files(REPO_ROOT)), len(curated_tips(REPO_ROOT))
    assert good.output.strip() == f"knowledge: {files} files, {tips} tips, all good"
    expected = plant_problems(tree)
    bad = runner.invoke(app, ["check", "--root", str(tree)])
    assert bad.exit_code == 1
    assert sorted(bad.output.strip().split("\n")) == sorted(expected)


def test_turbo_opt_mounts_the_commands_as_one_sub_app(tree: Path) -> None:
    parent = typer.Typer()
    register(parent)
    plant_problems(tree)
    assert runner.invoke(parent, ["knowledge", "check", "--root", str(tree)]).exit_code == 1
    listed = runner.invoke(parent, ["knowledge", "--op", "gemm", "--json", "--root", str(REPO_ROOT)])
    assert listed.exit_code == 0, listed.output


def paths(files: list) -> list[str]:
    return [f.path for f in files]


def test_applicable_routes_by_op_device_and_backend() -> None:
    assert paths(applicable(REPO_ROOT, "grouped_gemm_fp8", H100)) == HOPPER + TRITON + GLUON + GROUPED_FP8
    assert paths(applicable(REPO_ROOT, "grouped_gemm_fp8", "NVIDIA H200")) == HOPPER + TRITON + GLUON + GROUPED_FP8
    assert paths(applicable(REPO_ROOT, "grouped_gemm_fp8", "cpu (Triton interpreter)")) == TRITON + GLUON + GROUPED_FP8
    assert paths(applicable(REPO_ROOT, "grouped_gemm_fp8", H100, backend="gluon")) == HOPPER + GLUON + GROUPED_FP8
    # bf16 grouped GEMM is written in Triton only: no Gluon files.
    assert paths(applicable(REPO_ROOT, "grouped_gemm")) == HOPPER + TRITON + [
        "knowledge/ops/grouped_gemm/overview.md", "knowledge/ops/grouped_gemm/optimization-directions.md"]
    hopper = applicable(REPO_ROOT, "gemm", H100)[0]
    assert (hopper.kind, hopper.subject, hopper.devices) == ("hardware", "hopper", ["H100", "H200"])
    with pytest.raises(UserError, match=r"^unknown op 'nope' \(registered: attention, gemm, "):
        applicable(REPO_ROOT, "nope")
    with pytest.raises(UserError, match=r"^unknown backend 'cuda' \(known: gluon, triton\)"):
        applicable(REPO_ROOT, "gemm", backend="cuda")


def test_cli_json_lists_the_files_and_the_tips_of_the_context() -> None:
    args = ["--op", "grouped_gemm_fp8", "--device", H100, "--variant", "e4m3-blockwise", "--json"]
    result = runner.invoke(app, [*args, "--root", str(REPO_ROOT)])
    assert result.exit_code == 0, result.output
    listing = json.loads(result.stdout)
    assert [f["path"] for f in listing["files"]] == HOPPER + TRITON + GLUON + GROUPED_FP8
    assert listing["files"][0]["evidence"][0] == {"doc": "docs/performance.md"}
    assert listing["tips"], "the curated grouped_gemm_fp8 tips include e4m3-blockwise ones on the H100"
    assert {(t["op"], t["device"], t["variant"]) for t in listing["tips"]} == {("grouped_gemm_fp8", H100,
                                                                                "e4m3-blockwise")}
    assert len(listing["tips"]) == len(load_tips(REPO_ROOT, "grouped_gemm_fp8", H100, "e4m3-blockwise"))


def test_cli_table_and_its_errors() -> None:
    table = runner.invoke(app, ["--op", "gemm_fp8", "--root", str(REPO_ROOT)])
    assert table.exit_code == 0, table.output
    assert "knowledge/ops/gemm_fp8/optimization-directions.md" in table.output
    assert "tips (" in table.output
    unknown = runner.invoke(app, ["--op", "nope", "--root", str(REPO_ROOT)])
    assert unknown.exit_code == 2
    assert unknown.stderr.startswith("error: unknown op 'nope'")
    bare = runner.invoke(app, ["--root", str(REPO_ROOT)])
    assert bare.exit_code == 2
    assert "give --op OP" in bare.stderr


def test_tips_round_trip_and_filter(tmp_path: Path) -> None:
    curated = [tip(), tip(device="NVIDIA H200", gain_pct=None), tip(variant="e4m3-rowwise", op="gemm_fp8")]
    learned = [tip(proposer="search", campaign="c1", commit=None, params={"bucket": "large", "knob": "num_stages",
                                                                          "old": 3, "new": 4})]
    write_tips(tmp_path / "knowledge" / "tips" / "gemm.yaml", curated)
    write_tips(tmp_path / "campaigns" / "runs" / "c1" / "tips.yaml", learned)
    (tmp_path / "campaigns" / "runs" / "c2").mkdir()
    (tmp_path / "campaigns" / "runs" / "c2" / "tips.yaml").write_text("tips: [{op: gemm}]\n")  # skipped, not fatal
    assert (tmp_path / "knowledge" / "tips" / "gemm.yaml").read_text().startswith("tips:\n- op: gemm\n  backend: ")
    assert [p.relative_to(tmp_path).as_posix() for p in tip_files(tmp_path)] == [
        "knowledge/tips/gemm.yaml", "campaigns/runs/c1/tips.yaml", "campaigns/runs/c2/tips.yaml"]
    assert load_tips(tmp_path, "gemm") == [curated[0], curated[1], learned[0]]
    assert load_tips(tmp_path, "gemm", device=H100) == [curated[0], learned[0]]
    assert load_tips(tmp_path, "gemm", device="NVIDIA H200", variant="default") == [curated[1]]
    assert load_tips(tmp_path, "gemm_fp8", variant="e4m3-rowwise") == [curated[2]]
    assert load_tips(tmp_path, "grouped_gemm") == []
