#!/usr/bin/env bash
# mypy over the collection's plugins and every test tree (make sanity); the settings are in mypy.ini.
#
# The plugins are checked under their import names, through collections/ (see mypy.ini). Each test tree
# imports its neighbours as pytest's rootdir insertion lets it (`from simfleet import ...`, `import simgpu`),
# so each run gives mypy those directories on MYPYPATH. Trees with a conftest.py of their own get a run each:
# one run cannot hold two modules named conftest.
set -euo pipefail
root=$(cd "$(dirname "${BASH_SOURCE[0]}")/../.." && pwd)
cd "$root"
mypy=${MYPY:-$root/.venv/bin/mypy}
t=tests
status=0
run() {  # run NAME MYPYPATH PATH...: a cache per run, as each run resolves some names differently
  local name=$1 path=$2
  shift 2
  MYPYPATH=$path "$mypy" --cache-dir "$root/.mypy_cache/typecheck-$name" "$@" || status=1
}
# The collection's code and the tests that import only the collection.
run collection "" collections/ansible_collections/gpufleet/sglang/plugins $t/unit $t/tools
# The simulated fleet: the simulators, the integration tier, and the demo and benchmarks built on it.
run fleet $t/support:$t/integration:$t/simgpu:$t/simsglang $t/support $t/integration $t/simgpu $t/simsglang $t/bench $t/demo
run reliability $t/support:$t/reliability:$t/integration:$t/simgpu $t/reliability
run awx $t/support:$t/awx:$t/integration:$t/simgpu $t/awx
run containers $t/containers $t/containers $t/molecule $t/contract
run real $t/support:$t/real:$t/real/standin:$t/integration:$t/simgpu $t/real
exit $status
