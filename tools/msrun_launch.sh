#!/usr/bin/env bash
# Start a MindSpore job with msrun, on one node or as one node of a multi-node job.
# Run `tools/msrun_launch.sh --help` for the options.
set -euo pipefail

usage() {
  cat <<'USAGE'
Usage: tools/msrun_launch.sh [OPTIONS] [--] COMMAND [ARGS...]

COMMAND is either
  RECIPE.yaml [TRAIN ARGS]   run `hyperparallel train RECIPE [TRAIN ARGS]`; the msrun
                             settings below reach it in HP_MSRUN_ARGS (see docs/launch.md)
  SCRIPT.py [ARGS]           run `msrun [FLAGS] SCRIPT.py [ARGS]` on every rank (e.g.
                             python -m hyperparallel.runtime.worker JOB.json, or MindFormers'
                             run_mindformer.py --config CONFIG.yaml)

MindFormers' scripts/msrun_launcher.sh form is accepted too: the command quoted as one word, then
its positional values, which set the options below of the same names:
  "COMMAND ARGS" [WORKER_NUM [MASTER_PORT [LOG_DIR [JOIN [CLUSTER_TIME_OUT]]]]]
  "COMMAND ARGS" WORKER_NUM LOCAL_WORKER MASTER_ADDR MASTER_PORT NODE_RANK [LOG_DIR [JOIN [CLUSTER_TIME_OUT]]]

Options (msrun's names; `--name=value` or `--name value`):
  --worker_num N          ranks in the whole job, all nodes            (default 8)
  --local_worker_num N    ranks on this node                           (default: worker_num)
  --master_addr ADDR      address of node 0 (msrun's scheduler)        (default 127.0.0.1)
  --master_port PORT      scheduler port, same on every node          (default 8118)
  --node_rank R           index of this node, 0..nodes-1               (default 0)
  --log_dir DIR           worker logs (worker_N.log)                   (default output/msrun_log)
  --join True|False       msrun waits for the workers, reports failure (default True;
                          a recipe needs True: hyperparallel train waits for its ranks)
  --cluster_time_out S    seconds to wait for all nodes to join        (default 600)
  --bind_core True|False  bind CPU cores to workers (msrun)            (default: not passed)
  --dry-run               print the exact command and exit
  -h, --help              this text

Multi-node: run the same command on every node with the same --worker_num, --master_addr
and --master_port, and each node's own --node_rank. Environment: MSRUN (default msrun),
HYPERPARALLEL (default hyperparallel) name the programs that are started.
USAGE
}

die() { echo "msrun_launch.sh: error: $*" >&2; exit 2; }

is_uint() { [[ "$1" =~ ^[0-9]+$ ]]; }

# One word of a command, quoted for a POSIX shell only when it needs it.
quote() {
  if [[ "$1" =~ ^[A-Za-z0-9_./=:,+@%-]+$ ]]; then printf '%s' "$1"
  else printf "'%s'" "${1//\'/\'\\\'\'}"; fi
}

worker_num=8; local_worker_num=""; master_addr=127.0.0.1; master_port=8118; node_rank=0
log_dir=output/msrun_log; join=True; cluster_time_out=600; bind_core=""; dry_run=0

while [[ $# -gt 0 ]]; do
  arg="$1"
  case "$arg" in
    -h|--help) usage; exit 0 ;;
    --dry-run|--dry_run) dry_run=1; shift; continue ;;
    --) shift; break ;;
    --*=*) name="${arg%%=*}"; value="${arg#*=}"; shift ;;
    --*) name="$arg"; [[ $# -ge 2 ]] || die "$name needs a value"; value="$2"; shift 2 ;;
    *) break ;;
  esac
  case "$name" in
    --worker_num) worker_num="$value" ;;
    --local_worker_num) local_worker_num="$value" ;;
    --master_addr) master_addr="$value" ;;
    --master_port) master_port="$value" ;;
    --node_rank) node_rank="$value" ;;
    --log_dir) log_dir="$value" ;;
    --join) join="$value" ;;
    --cluster_time_out) cluster_time_out="$value" ;;
    --bind_core) bind_core="$value" ;;
    *) die "unknown option $name; allowed: --worker_num --local_worker_num --master_addr --master_port --node_rank --log_dir --join --cluster_time_out --bind_core --dry-run --help" ;;
  esac
done

[[ $# -ge 1 ]] || die "missing COMMAND (a recipe .yaml or a script .py); see --help"

# MindFormers' scripts/msrun_launcher.sh form: one quoted command, then positional values
#   "COMMAND ARGS" [WORKER_NUM [MASTER_PORT [LOG_DIR [JOIN [CLUSTER_TIME_OUT]]]]]              (one node)
#   "COMMAND ARGS" WORKER_NUM LOCAL_WORKER MASTER_ADDR MASTER_PORT NODE_RANK [LOG_DIR [JOIN [CLUSTER_TIME_OUT]]]
if [[ "$1" == *" "* ]]; then
  read -r -a quoted <<< "$1"; shift
  if (( $# <= 5 )); then
    worker_num="${1:-$worker_num}"; master_port="${2:-$master_port}"; log_dir="${3:-$log_dir}"
    join="${4:-$join}"; cluster_time_out="${5:-$cluster_time_out}"; local_worker_num="$worker_num"
  elif (( $# <= 8 )); then
    worker_num="$1"; local_worker_num="$2"; master_addr="$3"; master_port="$4"; node_rank="$5"
    log_dir="${6:-$log_dir}"; join="${7:-$join}"; cluster_time_out="${8:-$cluster_time_out}"
  else
    die "MindFormers' positional form takes at most 8 values after the quoted command (WORKER_NUM LOCAL_WORKER MASTER_ADDR MASTER_PORT NODE_RANK LOG_DIR JOIN CLUSTER_TIME_OUT), got $#"
  fi
  set -- "${quoted[@]}"
fi
local_worker_num="${local_worker_num:-$worker_num}"
for v in worker_num local_worker_num master_port node_rank; do
  is_uint "${!v}" || die "--$v must be a whole number, got '${!v}'"
done
[[ "$cluster_time_out" =~ ^-?[0-9]+$ ]] || die "--cluster_time_out must be a whole number of seconds, got '$cluster_time_out'"
(( worker_num >= 1 )) || die "--worker_num must be >= 1"
(( local_worker_num >= 1 && local_worker_num <= worker_num )) \
  || die "--local_worker_num must be 1..worker_num ($worker_num), got $local_worker_num"
(( worker_num % local_worker_num == 0 )) \
  || die "--worker_num ($worker_num) must be a multiple of --local_worker_num ($local_worker_num)"
nodes=$(( worker_num / local_worker_num ))
(( node_rank < nodes )) || die "--node_rank must be 0..$((nodes - 1)) for $nodes node(s), got $node_rank"
(( master_port >= 1024 && master_port <= 65535 )) || die "--master_port must be 1024..65535, got $master_port"
case "$join" in True|False) ;; *) die "--join must be True or False, got '$join'" ;; esac
case "$bind_core" in ""|True|False) ;; *) die "--bind_core must be True or False, got '$bind_core'" ;; esac

flags=(--worker_num="$worker_num" --local_worker_num="$local_worker_num" --master_addr="$master_addr"
       --master_port="$master_port" --node_rank="$node_rank" --log_dir="$log_dir" --join="$join"
       --cluster_time_out="$cluster_time_out")
[[ -n "$bind_core" ]] && flags+=(--bind_core="$bind_core")

target="$1"
case "$target" in
  *.yaml|*.yml)
    # hyperparallel train waits for its ranks to report every step and the result
    [[ "$join" == True ]] || die "--join False is not supported for a recipe (hyperparallel train waits for its ranks); give True or leave it out"
    env_value=""
    for f in "${flags[@]}"; do env_value+="$(quote "$f") "; done
    env_value="${env_value% }"
    cmd=(env "HP_MSRUN_ARGS=$env_value" "${HYPERPARALLEL:-hyperparallel}" train "$@") ;;
  *)
    cmd=("${MSRUN:-msrun}" "${flags[@]}" "$@") ;;
esac

if (( dry_run )); then
  out=""
  for w in "${cmd[@]}"; do out+="$(quote "$w") "; done
  printf '%s\n' "${out% }"
  exit 0
fi
mkdir -p "$log_dir"
exec "${cmd[@]}"
