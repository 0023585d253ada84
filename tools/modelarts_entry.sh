#!/usr/bin/env bash
# ModelArts training-job entry: map the job's environment to msrun flags, then start the
# job through tools/msrun_launch.sh (for a recipe: `hyperparallel train RECIPE ...`).
# Run `tools/modelarts_entry.sh --help` for the options.
set -euo pipefail

usage() {
  cat <<'USAGE'
Usage: tools/modelarts_entry.sh [OPTIONS] [--] RECIPE.yaml [TRAIN ARGS...]
       tools/modelarts_entry.sh [OPTIONS] [--] SCRIPT.py [ARGS...]

Set this as the ModelArts job's boot command on every node. It reads the job
environment (flags override it), computes msrun's flags and runs
tools/msrun_launch.sh, which starts `hyperparallel train RECIPE` (or msrun SCRIPT.py).

  value             flag                 ModelArts environment, first one set wins     default
  nodes             --nodes N            MA_NUM_HOSTS, VC_WORKER_NUM                     1
  this node's index --node_rank R        VC_TASK_INDEX, MA_TASK_INDEX                    0
  master address    --master_addr ADDR   first host of VC_WORKER_HOSTS (comma-separated),
                                         else ${MA_VJ_NAME}-${MA_TASK_NAME}-0.${MA_VJ_NAME}  127.0.0.1
  devices per node  --devices_per_node D MA_NUM_GPUS                                     8
  master port       --master_port PORT   HP_MASTER_PORT                                  8118
  log folder        --log_dir DIR        HP_LOG_DIR                                      output/msrun_log
  join timeout (s)  --cluster_time_out S HP_CLUSTER_TIME_OUT                             600
  --dry-run         print the exact command (and, on stderr, where each value came from)
  -h, --help        this text

msrun gets --worker_num=nodes*devices_per_node --local_worker_num=devices_per_node
--node_rank --master_addr --master_port --log_dir --join=True --cluster_time_out.
USAGE
}

die() { echo "modelarts_entry.sh: error: $*" >&2; exit 2; }
here="$(cd "$(dirname "${BASH_SOURCE[0]}")" && pwd)"

# first_set VAR... : the value of the first variable that is set and not empty, and its name
first_set() {
  local v
  for v in "$@"; do
    if [[ -n "${!v:-}" ]]; then printf '%s %s' "$v" "${!v}"; return 0; fi
  done
  return 1
}

nodes=""; node_rank=""; master_addr=""; devices=""; master_port=""; log_dir=""; cto=""; dry_run=0
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
    --nodes) nodes="$value" ;;
    --node_rank) node_rank="$value" ;;
    --master_addr) master_addr="$value" ;;
    --devices_per_node) devices="$value" ;;
    --master_port) master_port="$value" ;;
    --log_dir) log_dir="$value" ;;
    --cluster_time_out) cto="$value" ;;
    *) die "unknown option $name; allowed: --nodes --node_rank --master_addr --devices_per_node --master_port --log_dir --cluster_time_out --dry-run --help" ;;
  esac
done
[[ $# -ge 1 ]] || die "missing RECIPE.yaml or SCRIPT.py; see --help"

src_nodes=flag; src_rank=flag; src_addr=flag; src_dev=flag; src_port=flag; src_log=flag; src_cto=flag
if [[ -z "$nodes" ]]; then
  if r="$(first_set MA_NUM_HOSTS VC_WORKER_NUM)"; then src_nodes="${r%% *}"; nodes="${r#* }"; else src_nodes=default; nodes=1; fi
fi
if [[ -z "$node_rank" ]]; then
  if r="$(first_set VC_TASK_INDEX MA_TASK_INDEX)"; then src_rank="${r%% *}"; node_rank="${r#* }"; else src_rank=default; node_rank=0; fi
fi
if [[ -z "$master_addr" ]]; then
  if [[ -n "${VC_WORKER_HOSTS:-}" ]]; then
    src_addr=VC_WORKER_HOSTS; master_addr="${VC_WORKER_HOSTS%%,*}"
  elif [[ -n "${MA_VJ_NAME:-}" && -n "${MA_TASK_NAME:-}" ]]; then
    src_addr="MA_VJ_NAME,MA_TASK_NAME"; master_addr="${MA_VJ_NAME}-${MA_TASK_NAME}-0.${MA_VJ_NAME}"
  else
    src_addr=default; master_addr=127.0.0.1
  fi
fi
if [[ -z "$devices" ]]; then
  if r="$(first_set MA_NUM_GPUS)"; then src_dev="${r%% *}"; devices="${r#* }"; else src_dev=default; devices=8; fi
fi
if [[ -z "$master_port" ]]; then
  if r="$(first_set HP_MASTER_PORT)"; then src_port="${r%% *}"; master_port="${r#* }"; else src_port=default; master_port=8118; fi
fi
if [[ -z "$log_dir" ]]; then
  if r="$(first_set HP_LOG_DIR)"; then src_log="${r%% *}"; log_dir="${r#* }"; else src_log=default; log_dir=output/msrun_log; fi
fi
if [[ -z "$cto" ]]; then
  if r="$(first_set HP_CLUSTER_TIME_OUT)"; then src_cto="${r%% *}"; cto="${r#* }"; else src_cto=default; cto=600; fi
fi

[[ "$nodes" =~ ^[0-9]+$ ]] && (( nodes >= 1 )) || die "node count must be a whole number >= 1, got '$nodes' ($src_nodes)"
[[ "$devices" =~ ^[0-9]+$ ]] && (( devices >= 1 )) || die "devices per node must be a whole number >= 1, got '$devices' ($src_dev)"
[[ "$node_rank" =~ ^[0-9]+$ ]] || die "node index must be a whole number, got '$node_rank' ($src_rank)"
(( node_rank < nodes )) || die "node index $node_rank ($src_rank) is not below the node count $nodes ($src_nodes)"

if (( dry_run )); then
  {
    echo "# nodes=$nodes ($src_nodes) node_rank=$node_rank ($src_rank) master_addr=$master_addr ($src_addr)"
    echo "# devices_per_node=$devices ($src_dev) master_port=$master_port ($src_port) log_dir=$log_dir ($src_log) cluster_time_out=$cto ($src_cto)"
  } >&2
fi

launch=("$here/msrun_launch.sh" --worker_num="$(( nodes * devices ))" --local_worker_num="$devices"
        --master_addr="$master_addr" --master_port="$master_port" --node_rank="$node_rank"
        --log_dir="$log_dir" --join=True --cluster_time_out="$cto")
(( dry_run )) && launch+=(--dry-run)
exec "${launch[@]}" -- "$@"
