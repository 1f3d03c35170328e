#!/usr/bin/env bash
# torch_memory_saver's own example programs (its repository's test/examples:
# simple, cpu_backup, cuda_graph, rl_example, training_engine), unchanged, on
# libsymmem's drop-in, each in a fresh process, through both entry points:
#   install  python -c "import symmem.compat; symmem.compat.install(); <run the program>"
#   module   python -m symmem.compat -- python PROGRAM.py MODE
# in hook mode "preload" (training_engine with TMS_INIT_ENABLE=1
# TMS_INIT_ENABLE_CPU_BACKUP=1, as its own test_examples.py runs it) and, for
# the programs its tests also run so, hook mode "torch". One line per run,
# PASS or FAIL, logs in ${OUT:-/tmp/tms-examples}; exit 1 if any failed.
#
#   bash scripts/tms_examples.sh            # libsymmem's drop-in
#   bash scripts/tms_examples.sh --real     # the same programs on the real torch_memory_saver
#                                           # (importable here, e.g. its wheel from .whl/)
#
# The programs are never committed: fetch them into the git-ignored .scratch/
# on a machine with network, then carry that folder to the GPU machine:
#
#   git clone https://github.com/fzyzcjy/torch_memory_saver .scratch/torch_memory_saver
#   git -C .scratch/torch_memory_saver checkout v0.0.10   # or the commit to compare with
#
# or, from a bare mirror of the repository, only the examples:
#
#   mkdir -p .scratch/torch_memory_saver && git --git-dir=MIRROR archive HEAD test/examples \
#     | tar -x -C .scratch/torch_memory_saver
#
# TMS_REPO names another copy; PROGRAMS, MODES and ENTRIES (space-separated)
# choose a subset, e.g. PROGRAMS="cpu_backup training_engine" MODES=preload.
# Needs a GPU, torch, and build/libsymmem.so (SYMMEM_LIBRARY) or an
# installed symmem.
set -uo pipefail
cd "$(dirname "$0")/.."
root=$PWD
repo=${TMS_REPO:-$root/.scratch/torch_memory_saver}
examples=$repo/test/examples
out=${OUT:-/tmp/tms-examples}
real=0
[ "${1:-}" = --real ] && real=1
if [ ! -d "$examples" ]; then
  echo "no $examples: fetch torch_memory_saver's repository first (see the comment at the top of $0)" >&2
  exit 2
fi
mkdir -p "$out"
export PYTHONUNBUFFERED=1
[ -f build/libsymmem.so ] && export SYMMEM_LIBRARY=${SYMMEM_LIBRARY:-$root/build/libsymmem.so}
export PYTHONPATH=$root/python${PYTHONPATH:+:$PYTHONPATH}
py=${PYTHON:-python3}
status=0
run() { # run PROGRAM MODE ENTRY
  local prog=$1 mode=$2 entry=$3 env=()
  [ "$prog" = training_engine ] && env=(TMS_INIT_ENABLE=1 TMS_INIT_ENABLE_CPU_BACKUP=1)
  local file=$examples/$prog.py log=$out/$prog.$mode.$entry.log t0=$SECONDS
  local cmd
  case $entry in
    install) cmd=("$py" -c "import sys, runpy, symmem.compat; symmem.compat.install(); sys.argv = ['$file', '$mode']; runpy.run_path('$file', run_name='__main__')") ;;
    module) cmd=("$py" -m symmem.compat -- "$py" "$file" "$mode") ;;
    real) # as torch_memory_saver's test_examples.py: LD_PRELOAD for preload mode
      cmd=("$py" -c "import contextlib, subprocess, sys, torch_memory_saver as t
ctx = t.configure_subprocess() if '$mode' == 'preload' else contextlib.nullcontext()
with ctx:
    sys.exit(subprocess.run([sys.executable, '$file', '$mode']).returncode)") ;;
  esac
  if (cd "$examples" && env "${env[@]}" timeout 900 "${cmd[@]}") >"$log" 2>&1; then
    echo "PASS $prog $mode $entry ($((SECONDS - t0)) s)"
  else
    echo "FAIL $prog $mode $entry ($((SECONDS - t0)) s); last lines of $log:"
    tail -n 15 "$log" | sed 's/^/    /'
    status=1
  fi
}
read -r -a entries <<<"${ENTRIES:-install module}"
[ $real = 1 ] && entries=(real)
read -r -a programs <<<"${PROGRAMS:-simple cpu_backup cuda_graph rl_example training_engine}"
for prog in "${programs[@]}"; do
  read -r -a modes <<<"${MODES:-preload torch}"
  [ "$prog" = training_engine ] && modes=(preload)  # TMS_INIT_ENABLE: preload only, as its tests run it
  for mode in "${modes[@]}"; do
    for entry in "${entries[@]}"; do run "$prog" "$mode" "$entry"; done
  done
done
exit $status
