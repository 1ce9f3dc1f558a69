#!/usr/bin/env bash
# Issue 16's campaign acceptance, one device call each (under 10 minutes): the preset campaign on
# Llama-3 8B attention, as a user starts it, and its report. A campaign that outlives the call is killed
# between steps of a round and goes on with `resume` on the same (still warm) machine: the carried tree
# is sent again, so the campaign's own commits are checked out first. Carry .whl (pydantic, gitpython).
#   run(command="bash scripts/gpu_attention_campaign.sh start", carry=[".whl"], timeout_s=600)
#   run(command="bash scripts/gpu_attention_campaign.sh resume", carry=[".whl"], timeout_s=600)
source "$(dirname "$0")/gpu_env.sh"
install_wheels
NAME=llama3-attention

case "${1:-start}" in
  start)
    git_snapshot
    step campaign 560 python3 -m agent start --manifest campaigns/attention-llama3.yaml --max-iterations 10 \
      --name "$NAME"
    ;;
  resume)
    git checkout -q -- . && git status --short | head
    step resume 560 python3 -m agent resume "$NAME"
    ;;
esac
step status 30 python3 -m agent status "$NAME"
cp kernels/attention/tuning.py "$WORK/campaign-tuning.py"
cp -r "campaigns/runs/$NAME" "$WORK/" 2>/dev/null || true
git log --oneline -15 > "$WORK/git-log.txt"
