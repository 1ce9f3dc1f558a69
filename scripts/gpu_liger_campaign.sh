#!/usr/bin/env bash
# Issue 18 on the H100, one device call (under 10 minutes): a campaign on a Triton kernel outside
# turbo-opt, Liger-Kernel's RMSNorm, in a git checkout of its own (scripts/liger_repo.sh, from the sdist
# carried in .whl), with Liger's own RMSNorm tests as the focused test and bench_turbo_opt.py writing the
# frozen CSV; a scripted agent (campaigns/external/liger-rms-norm-plan.json) proposes two tuning changes,
# a wrong kernel and an edit of the tests. Needs in .whl: pydantic, gitpython (the README's wheels) and
# Liger's test dependencies: `../shared/tools/gpu-wheels.sh transformers tokenizers huggingface_hub hf_xet
# safetensors regex tqdm filelock fsspec httpx2 httpcore2 h11 anyio idna shellingham annotated_doc
# truststore packaging click` and `pip download --no-deps --no-binary :all: liger-kernel==0.8.5 -d .whl`.
#   run(command="bash scripts/gpu_liger_campaign.sh", carry=[".whl"], timeout_s=600)
source "$(dirname "$0")/gpu_env.sh"
install_wheels
git_snapshot
LIGER=/tmp/liger-kernel
step liger-repo 120 bash scripts/liger_repo.sh .whl/liger_kernel-0.8.5.tar.gz "$LIGER"
python3 - "$WORK/liger.yaml" "$LIGER" "$PWD" <<'PY'
import sys, yaml
out, liger, home = sys.argv[1:]
manifest = yaml.safe_load(open("campaigns/external/liger-rms-norm.yaml"))
manifest |= {"repo": liger, "proposer": {"kind": "command", "timeout_min": 2, "run":
             f"cd {home} && python3 -m tests.scripted_agent {home}/campaigns/external/liger-rms-norm-plan.json"}}
manifest["test_command"] = manifest["test_command"].replace("python ", "python3 ")
manifest["benchmark_command"] = manifest["benchmark_command"].replace("python ", "python3 ")
yaml.safe_dump(manifest, open(out, "w"), sort_keys=False)
PY
step campaign 470 python3 -m agent start --manifest "$WORK/liger.yaml"
run=campaigns/runs/liger-rms-norm
cp -r "$run" "$WORK/run" 2>/dev/null
git -C "$LIGER" log --oneline --all > "$WORK/liger-git-log.txt" 2>&1
sed -n '1,40p' "$run/report.md" 2>/dev/null
