#!/bin/bash
# sbatch slurm-array.sh
# A job array of 4 tasks: Slurm sets SLURM_ARRAY_TASK_ID to 1..4 and
# SLURM_ARRAY_TASK_COUNT to 4, and task K audits shard K/4 of the registry.
# When all are done: cat audit-*.jsonl > audit.jsonl
# (or sbatch --dependency=afterany:JOBID with that line, to join them as a job).
#SBATCH --job-name=memlayout-audit
#SBATCH --array=1-4
#SBATCH --cpus-per-task=2
#SBATCH --time=01:00:00
#SBATCH --output=memlayout-audit-%a.log

# --fail-on never: findings go into the report, not the exit code; a path it cannot read still exits 2
memlayout inspect --paths-from registry.txt --shard ${SLURM_ARRAY_TASK_ID}/${SLURM_ARRAY_TASK_COUNT} --fail-on never --format jsonl -o audit-${SLURM_ARRAY_TASK_ID}.jsonl
