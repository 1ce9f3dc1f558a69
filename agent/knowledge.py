"""The knowledge base: measured markdown per hardware, backend and op, and tips, for agents and the search.

    knowledge/hardware/<arch>/    overview.md, kernel-implementation-notes.md
    knowledge/backend/<name>/     programming-model.md, optimization-directions.md
    knowledge/ops/<op>/           overview.md, optimization-directions.md
    knowledge/tips/<op>.yaml      curated tips; a campaign writes its own to campaigns/runs/<name>/tips.yaml

Every markdown file opens with YAML front matter (`KnowledgeFile`) naming its evidence: commits,
commands and docs that `check_knowledge` verifies exist. `applicable` routes by op, device and
backend; `load_tips` filters tips by context. knowledge/README.md is the authors' guide.
"""

from __future__ import annotations

import os
import re
import shlex
from collections.abc import Mapping
from pathlib import Path
from typing import TYPE_CHECKING, Any, Literal

import git
import yaml
from pydantic import BaseModel, ConfigDict, Field, ValidationError, field_validator, model_validator

from harness.errors import UserError
from harness.files import REPO_ROOT, atomic_write_text
from harness.registry import op_names

if TYPE_CHECKING:
    from agent.manifest import Manifest

# top folder under knowledge/ -> the kind its files declare
KIND_OF_FOLDER: dict[str, str] = {"hardware": "hardware", "backend": "backend", "ops": "op"}
# The files each folder of a kind must hold, in reading order.
REQUIRED_FILES: dict[str, tuple[str, ...]] = {
    "hardware": ("overview.md", "kernel-implementation-notes.md"),
    "backend": ("programming-model.md", "optimization-directions.md"),
    "ops": ("overview.md", "optimization-directions.md"),
}
# (top folder or "*", file name) -> the `## ` sections it must have.
REQUIRED_SECTIONS: dict[tuple[str, str], tuple[str, ...]] = {
    ("hardware", "overview.md"): ("Facts", "Measured ceilings"),
    ("hardware", "kernel-implementation-notes.md"): ("Notes",),
    ("backend", "programming-model.md"): ("Model", "Pitfalls"),
    ("*", "optimization-directions.md"): ("Directions", "Did not work"),
    ("ops", "overview.md"): ("Algorithm", "Passes", "Where time goes", "Measured"),
}
# Sections whose every top-level bullet must carry a measured figure (at least one digit).
MEASURED_SECTIONS = frozenset({"Directions", "Did not work", "Measured", "Measured ceilings"})
READING_ORDER = ("overview.md", "programming-model.md", "kernel-implementation-notes.md", "optimization-directions.md")
# A token of an evidence command that names a repo file: relative, no shell variables.
_PATH_TOKEN = re.compile(r"[\w.+-]+(/[\w.+-]+)*")
_SHA = re.compile(r"[0-9a-f]{7,40}")


class KnowledgeFile(BaseModel):
    """One markdown file of the knowledge base: its front matter and where it lives."""

    model_config = ConfigDict(extra="forbid")

    path: str  # repo-relative, posix
    kind: Literal["hardware", "backend", "op"]
    subject: str  # the folder name: arch, backend or op
    title: str = Field(min_length=1)
    summary: str = Field(min_length=1)
    devices: list[str] = []  # hardware: substrings of torch.cuda.get_device_name() this arch covers
    backends: list[str] = []  # op: the backends its kernels are written in
    evidence: list[dict[Literal["commit", "command", "doc"], str]] = Field(min_length=1)

    @field_validator("evidence")
    @classmethod
    def _one_key_each(cls, evidence: list[dict[str, str]]) -> list[dict[str, str]]:
        for entry in evidence:
            if len(entry) != 1 or not str(next(iter(entry.values()))).strip():
                raise ValueError(f"each evidence entry is one of commit | command | doc with a value, got {entry}")
        return evidence

    @model_validator(mode="after")
    def _routing_keys(self) -> KnowledgeFile:
        # Routing reads devices from hardware files and backends from op files: nowhere else do they mean anything.
        if (self.kind == "hardware") != bool(self.devices):
            raise ValueError("devices: required on hardware files, and only there")
        if (self.kind == "op") != bool(self.backends):
            raise ValueError("backends: required on op files, and only there")
        return self


class Tip(BaseModel):
    """What one change taught, with the context it was measured in."""

    model_config = ConfigDict(extra="forbid")

    op: str  # a registered op
    backend: str  # triton | gluon
    device: str  # GPU name as torch reports it, e.g. "NVIDIA H100 80GB HBM3"
    variant: str  # the op's variant ("default" if it has none), e.g. "e4m3-blockwise"
    shape_class: str  # what it was measured on: a preset, a tuned-table bucket, or shape labels
    summary: str  # one line: what changed
    hypothesis: str = ""
    # For a tuned-table move: file, bucket, knob, old, new, config (the whole bucket config it was measured from).
    params: dict[str, Any] = {}
    proposer: str = "curated"  # search | manual | command | curated
    outcome: Literal["ACCEPT", "ROLLBACK", "ERROR"]
    gain_pct: float | None  # measured effect on the campaign's primary metric, percent
    reason: str  # why (the verdict or the measurement)
    campaign: str | None = None  # None for curated tips
    commit: str | None = None  # the commit that shows it
    evidence: str = ""  # the command that measured it


def shape_class(manifest: Manifest) -> str:
    """What a campaign's tips say they were measured on: its shape preset and representative shapes."""
    shapes = manifest.shapes if isinstance(manifest.shapes, str) else "custom shapes"
    return f"{shapes}: {', '.join(manifest.representative_shapes)}"


def similarity(tip: Tip, variant: str, shapes: str, config: Mapping[str, int]) -> float:
    """How alike the context a tip was measured in is to this one, from 0 to 1: the same variant and the
    same shape class count a quarter each, the bucket config it was measured from (params `config`, or
    `old` for a whole-config move) the other half, by the share of its knobs that are equal."""
    measured_from = tip.params.get("config") or tip.params.get("old") or {}
    knobs = set(config) | set(measured_from)
    same = sum(measured_from.get(k) == config.get(k) for k in knobs) / len(knobs) if knobs else 0.0
    return 0.25 * (tip.variant == variant) + 0.25 * (tip.shape_class == shapes) + 0.5 * same


class TipFile(BaseModel):
    tips: list[Tip] = []


# --- reading ---------------------------------------------------------------------------------------


def _rel(path: Path, root: Path) -> str:
    return path.relative_to(root).as_posix() if path.is_relative_to(root) else path.as_posix()


def _split_front_matter(text: str, rel: str) -> tuple[dict[str, Any], str]:
    lines = text.split("\n")
    if lines[0].strip() != "---":
        raise UserError(f"{rel}: does not open with YAML front matter (a '---' line)")
    try:
        end = next(i for i, line in enumerate(lines[1:], 1) if line.strip() == "---")
    except StopIteration:
        raise UserError(f"{rel}: front matter has no closing '---' line") from None
    try:
        front = yaml.safe_load("\n".join(lines[1:end]))
    except yaml.YAMLError as exc:
        raise UserError(f"{rel}: front matter is not YAML: {' '.join(str(exc).split())}") from None
    if not isinstance(front, dict):
        raise UserError(f"{rel}: front matter must be a mapping of keys")
    return front, "\n".join(lines[end + 1:])


def _one_line(exc: ValidationError) -> str:
    return "; ".join(f"{'.'.join(map(str, e['loc'])) or 'value'}: {e['msg']}" for e in exc.errors())


def _parse(path: Path, root: Path) -> tuple[KnowledgeFile, str]:
    """A knowledge file's front matter and its markdown body."""
    rel = _rel(path, root)
    try:
        text = path.read_text(encoding="utf-8")
    except OSError as exc:
        raise UserError(f"{rel}: cannot be read: {exc.strerror}") from None
    front, body = _split_front_matter(text, rel)
    try:
        return KnowledgeFile.model_validate({**front, "path": rel}), body
    except ValidationError as exc:
        raise UserError(f"{rel}: front matter: {_one_line(exc)}") from None


def read_knowledge_file(path: Path, root: Path = REPO_ROOT) -> KnowledgeFile:
    """The front matter of one knowledge markdown file; a UserError (one line naming the file) if it is bad."""
    return _parse(Path(path), root)[0]


def _read_folder(root: Path, top: str, subject: str) -> list[KnowledgeFile]:
    """A subject's files in reading order (overview first), then any others by name."""
    rank = {name: i for i, name in enumerate(READING_ORDER)}
    files = sorted((root / "knowledge" / top / subject).glob("*.md"),
                   key=lambda p: (rank.get(p.name, len(rank)), p.name))
    return [read_knowledge_file(p, root) for p in files]


def _subjects(root: Path, top: str) -> list[str]:
    folder = root / "knowledge" / top
    return sorted(p.name for p in folder.iterdir() if p.is_dir()) if folder.is_dir() else []


def applicable(root: Path, op: str, device: str | None = None, backend: str | None = None) -> list[KnowledgeFile]:
    """The knowledge files that apply to work on `op`: hardware (device None: every arch; a device no arch
    names, such as the CPU interpreter: none), backend (`backend`, else the op's backends and triton),
    then the op's own files."""
    if op not in op_names():
        raise UserError(f"unknown op '{op}' (registered: {', '.join(op_names()) or 'none'})")
    if backend is not None and backend not in _subjects(root, "backend"):
        raise UserError(f"unknown backend '{backend}' (known: {', '.join(_subjects(root, 'backend')) or 'none'})")
    ops = _read_folder(root, "ops", op)
    if backend is None:
        listed = next((f.backends for f in ops if Path(f.path).name == "overview.md"), [])
        backends = ["triton", *(b for b in listed if b != "triton")]
    else:
        backends = [backend]
    return general_knowledge(root, device, backends) + ops


def general_knowledge(root: Path, device: str | None, backends: list[str]) -> list[KnowledgeFile]:
    """The hardware files of the device (None: every arch) and the files of the backends the knowledge base
    has (others are skipped): what applies to any kernel, turbo-opt's own or an external one."""
    hardware = [f for arch in _subjects(root, "hardware") for f in _read_folder(root, "hardware", arch)
                if device is None or any(d in device for d in f.devices)]
    known = _subjects(root, "backend")
    return hardware + [f for b in backends if b in known for f in _read_folder(root, "backend", b)]


# --- tips ------------------------------------------------------------------------------------------


def _curated_tip_files(root: Path) -> list[Path]:
    return sorted((root / "knowledge" / "tips").glob("*.yaml"))


def tip_files(root: Path) -> list[Path]:
    """Curated tips (knowledge/tips/*.yaml) first, then each campaign's own (campaigns/runs/*/tips.yaml)."""
    return _curated_tip_files(root) + sorted((root / "campaigns" / "runs").glob("*/tips.yaml"))


def _read_tips(path: Path) -> list[Tip]:
    return TipFile.model_validate(yaml.safe_load(path.read_text(encoding="utf-8")) or {}).tips


def curated_tips(root: Path) -> list[Tip]:
    """Every tip of knowledge/tips/ (raises on a bad file: `check_knowledge` names them)."""
    return [t for path in _curated_tip_files(root) for t in _read_tips(path)]


def load_tips(root: Path, op: str, device: str | None = None, variant: str | None = None) -> list[Tip]:
    """Tips for this op, on this device and variant where given; unreadable files are skipped, not fatal
    (a campaign's half-written or older-format tips must not stop the next one)."""
    tips: list[Tip] = []
    for path in tip_files(root):
        try:
            tips += _read_tips(path)
        except (OSError, yaml.YAMLError, ValidationError):
            continue
    return [t for t in tips if t.op == op and device in (None, t.device) and variant in (None, t.variant)]


def write_tips(path: Path, tips: list[Tip]) -> None:
    text = yaml.safe_dump(TipFile(tips=tips).model_dump(mode="json"), sort_keys=False, width=120, allow_unicode=True)
    atomic_write_text(path, text)


# --- check -----------------------------------------------------------------------------------------


class _Commits:
    """Whether commits exist in the history of the git checkout holding `root` (memoized: files share them)."""

    def __init__(self, root: Path) -> None:
        try:
            self._git: git.Git | None = git.Repo(root, search_parent_directories=True).git
        except (git.InvalidGitRepositoryError, git.NoSuchPathError):
            self._git = None
        self._seen: dict[str, bool] = {}

    def exists(self, sha: str) -> bool:
        if sha not in self._seen:
            self._seen[sha] = self._git is not None and bool(_SHA.fullmatch(sha)) and self._cat_file(sha)
        return self._seen[sha]

    def _cat_file(self, sha: str) -> bool:
        try:
            self._git.cat_file("-e", f"{sha}^{{commit}}")
        except git.GitCommandError:
            return False
        return True


def _inside(root: Path, rel: str) -> bool:
    """Whether `rel` names a file of the repo: relative and not climbing out (checked lexically: the tree
    may hold symlinks)."""
    norm = os.path.normpath(rel)
    return not os.path.isabs(norm) and norm != ".." and not norm.startswith("../") and (root / norm).is_file()


def _command_problems(command: str, root: Path) -> list[str]:
    """A command must name at least one repo file (a script, a manifest) or a registered op; the repo files
    it names (.py/.sh tokens, and paths under an existing top-level folder) must exist, its ops be registered."""
    try:
        tokens = shlex.split(command)
    except ValueError as exc:
        return [f"evidence command '{command}': {exc}"]
    problems, named = [], 0
    for i, token in enumerate(tokens):
        if token.startswith("--op="):
            op = token.removeprefix("--op=")
        elif token == "--op" and i + 1 < len(tokens):
            op = tokens[i + 1]
        else:
            op = None
        if op is not None:
            named += 1
            if op not in op_names():
                problems.append(f"evidence command '{command}': unknown op '{op}'")
        elif _PATH_TOKEN.fullmatch(token) and (token.endswith((".py", ".sh"))
                                               or ("/" in token and (root / token.split("/")[0]).is_dir())):
            named += 1
            if not (root / token).exists():
                problems.append(f"evidence command '{command}': {token} does not exist")
    if not named:
        problems.append(f"evidence command '{command}': names no script, repo file or op")
    return problems


def _evidence_problems(f: KnowledgeFile, root: Path, commits: _Commits) -> list[str]:
    problems = []
    for entry in f.evidence:
        key, value = next(iter(entry.items()))
        if key == "commit" and not commits.exists(value):
            problems.append(f"{f.path}: evidence commit {value} is not in this repository's history")
        elif key == "doc" and not _inside(root, value):
            problems.append(f"{f.path}: evidence doc {value} is not a file of this repository")
        elif key == "command":
            problems += [f"{f.path}: {p}" for p in _command_problems(value, root)]
    return problems


def _sections(body: str) -> dict[str, list[str]]:
    """`## ` headings -> their lines, code fences skipped (a `## ` in a shell block is no heading)."""
    sections: dict[str, list[str]] = {}
    current: list[str] = []
    fenced = False
    for line in body.split("\n"):
        if line.startswith("```"):
            fenced = not fenced
        elif not fenced and line.startswith("## "):
            current = sections.setdefault(line[3:].strip(), [])
        elif not fenced:
            current.append(line)
    return sections


def _bullets(lines: list[str]) -> list[str]:
    """Top-level bullets ("- " at column 0), each with its indented continuation lines."""
    bullets: list[str] = []
    in_bullet = False
    for line in lines:
        if line.startswith("- "):
            bullets.append(line)
            in_bullet = True
        elif in_bullet and line.startswith(" ") and line.strip():
            bullets[-1] += " " + line.strip()
        else:
            in_bullet = False
    return bullets


def _section_problems(rel: str, top: str, body: str) -> list[str]:
    name = Path(rel).name
    required = REQUIRED_SECTIONS.get((top, name), ()) + REQUIRED_SECTIONS.get(("*", name), ())
    sections = _sections(body)
    problems = [f"{rel}: missing section '## {s}'" for s in required if s not in sections]
    for title in sorted(MEASURED_SECTIONS & sections.keys()):
        problems += [f"{rel}: a '## {title}' bullet has no measured figure: {b[:80]}"
                     for b in _bullets(sections[title]) if not any(c.isdigit() for c in b)]
    return problems


def _markdown_problems(path: Path, root: Path, commits: _Commits) -> list[str]:
    rel = _rel(path, root)
    parts = Path(rel).parts  # knowledge/<top>/<subject>/<name>.md
    if len(parts) != 4 or parts[1] not in KIND_OF_FOLDER:
        return [f"{rel}: outside the layout (knowledge/hardware|backend|ops/<subject>/<name>.md)"]
    try:
        f, body = _parse(path, root)
    except UserError as exc:
        return [str(exc)]
    problems = []
    if f.kind != KIND_OF_FOLDER[parts[1]]:
        problems.append(f"{rel}: kind '{f.kind}' does not match its folder {parts[1]}/ "
                        f"(kind '{KIND_OF_FOLDER[parts[1]]}')")
    if f.subject != parts[2]:
        problems.append(f"{rel}: subject '{f.subject}' does not match its folder '{parts[2]}'")
    problems += [f"{rel}: backend '{b}' has no knowledge/backend/{b}/" for b in f.backends
                 if not (root / "knowledge" / "backend" / b).is_dir()]
    return problems + _section_problems(rel, parts[1], body) + _evidence_problems(f, root, commits)


def _missing_files(root: Path) -> list[str]:
    """Every registered op needs its op files; every hardware and backend folder its own; no op folder
    may name an op that is not registered."""
    problems = [f"knowledge/ops/{s}/: '{s}' is not a registered op" for s in _subjects(root, "ops")
                if s not in op_names()]
    for top, names in REQUIRED_FILES.items():
        subjects = op_names() if top == "ops" else _subjects(root, top)
        problems += [f"knowledge/{top}/{subject}/{name}: missing" for subject in subjects for name in names
                     if not (root / "knowledge" / top / subject / name).is_file()]
    return problems


def _tip_problems(path: Path, root: Path, commits: _Commits) -> list[str]:
    rel = _rel(path, root)
    try:
        tips = _read_tips(path)
    except OSError as exc:
        return [f"{rel}: cannot be read: {exc.strerror}"]
    except yaml.YAMLError as exc:
        return [f"{rel}: not YAML: {' '.join(str(exc).split())}"]
    except ValidationError as exc:
        return [f"{rel}: {_one_line(exc)}"]
    problems = []
    for i, tip in enumerate(tips, 1):
        if tip.op not in op_names():
            problems.append(f"{rel}: tip {i}: unknown op '{tip.op}'")
        elif tip.op != path.stem:
            problems.append(f"{rel}: tip {i}: op '{tip.op}' belongs in knowledge/tips/{tip.op}.yaml")
        if not (root / "knowledge" / "backend" / tip.backend).is_dir():
            problems.append(f"{rel}: tip {i}: backend '{tip.backend}' has no knowledge/backend/{tip.backend}/")
        if tip.commit is not None and not commits.exists(tip.commit):
            problems.append(f"{rel}: tip {i}: commit {tip.commit} is not in this repository's history")
    return problems


def knowledge_files(root: Path) -> list[Path]:
    """Every markdown file under knowledge/ but its README."""
    return sorted(p for p in (root / "knowledge").rglob("*.md") if p != root / "knowledge" / "README.md")


def check_knowledge(root: Path) -> list[str]:
    """One line per problem of the knowledge base under `root`: front matter, folders, required files and
    sections, measured figures, evidence (commits in the history, scripts, ops and docs that exist), and
    the curated tips (schema, registered op, commit). Empty: all good."""
    commits = _Commits(root)
    problems = [p for path in knowledge_files(root) for p in _markdown_problems(path, root, commits)]
    problems += _missing_files(root)
    return problems + [p for path in _curated_tip_files(root) for p in _tip_problems(path, root, commits)]
