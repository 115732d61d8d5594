#!/usr/bin/env bash
# Makes a running container (systemd as PID 1) a simulated GPU host, the way a real one is before SGLang
# is installed, from the controller with one `podman cp` and one `podman exec` (an Ansible play of the same
# steps takes six times longer on the 2-core build machines):
#   - the driver's NVML library where the loader finds it: /usr/lib/x86_64-linux-gnu/libnvidia-ml.so.1,
#   - the GPUs' state in /var/lib/simgpu (the library's default), GPU_COUNT GPUs of 80 GiB, none reserved
#     (a clean GPU reads 0 MiB used through both NVML memory calls), memory released 200 ms after a kill,
#   - SIMGPU_STATE_DIR in systemd's DefaultEnvironment, where the simulated SGLang finds simsglang.json,
#   - the simulated SGLang's settings (SIMSGLANG_JSON) in /var/lib/simgpu/simsglang.json,
#   - the bundle (build-simhost-bundle.sh) in /opt/gpufleet-sim, whose wheels/ install.yml installs from,
#   - the model directories the scenarios serve (/models/...).
#
#   tests/molecule/simhost-setup.sh CONTAINER BUNDLE_TAR SIMSGLANG_JSON [GPU_COUNT]
# Needs CONTAINERS_CONF (tests/containers/env.sh). Safe to repeat.
set -euo pipefail

[ $# -ge 3 ] || { echo "usage: $0 CONTAINER BUNDLE_TAR SIMSGLANG_JSON [GPU_COUNT]" >&2; exit 2; }
name=$1 bundle=$2 config=$3 gpu_count=${4:-2}
[ -f "$bundle" ] || { echo "$0: no bundle at $bundle" >&2; exit 1; }

podman cp "$bundle" "$name:/tmp/gpufleet-simhost.tar"
podman exec -i -e "SIMSGLANG_JSON=$config" -e "GPU_COUNT=$gpu_count" "$name" /bin/bash -s <<'SH'
set -euo pipefail
state=$(systemctl is-system-running --wait || true)
case "$state" in running|degraded) ;; *) echo "systemd did not boot: $state" >&2; exit 1 ;; esac
mkdir -p /opt/gpufleet-sim
tar -C /opt/gpufleet-sim -xf /tmp/gpufleet-simhost.tar
rm -f /tmp/gpufleet-simhost.tar
install -m 0755 /opt/gpufleet-sim/lib/libnvidia-ml.so.1 /usr/lib/x86_64-linux-gnu/libnvidia-ml.so.1
ldconfig
mkdir -p /etc/systemd/system.conf.d
printf '[Manager]\nDefaultEnvironment=SIMGPU_STATE_DIR=/var/lib/simgpu\n' > /etc/systemd/system.conf.d/simgpu.conf
systemctl daemon-reexec
if [ ! -f /var/lib/simgpu/config ]; then
  PYTHONPATH=/opt/gpufleet-sim python3 -m simgpu.host create --state-dir /var/lib/simgpu \
    --gpu-count "$GPU_COUNT" --total-mib 81920 --reserved-mib 0 --release-delay-ms 200 >/dev/null
fi
printf '%s\n' "$SIMSGLANG_JSON" > /var/lib/simgpu/simsglang.json
# The model and draft directories the scenarios serve, as a host that downloaded them has them
# (sglang_launch refuses a local model path that does not exist before it stops anything).
mkdir -p /models/llama-3.1-8b-instruct /models/eagle3-llama-3.1-8b
SH
echo "$name: simulated GPU host ready ($gpu_count GPUs)"
