"""What a GPU machine tells its dockerd: its GPUs as swarm node generic resources, and the nvidia runtime.

For a type with GPUs (after its overhead), the daemon puts these lines in its user data, after the worker
env file and before the operator's boot script. On the machine they:

1. list the GPUs with `nvidia-smi --query-gpu=uuid` (the NVIDIA driver, on every GPU AMI the deployment
   guide lists) and write one `NVIDIA-GPU=<uuid>` per GPU the type publishes into `node-generic-resources`
   of `/etc/docker/daemon.json`, keeping whatever else the file holds (read and written with python3, which
   every cloud-init machine has: cloud-init is Python). Swarm then places a service that reserves
   `--generic-resource NVIDIA-GPU=1` only on such a node, and gives its task the GPU's uuid in
   `DOCKER_RESOURCE_NVIDIA-GPU`;
2. when `nvidia-container-runtime` is installed (the NVIDIA Container Toolkit: the Deep Learning AMIs and
   the ECS GPU-optimized AMI have it), register it as the `nvidia` runtime and make it dockerd's default, so
   every container on the machine (the worker service's among them, `NVIDIA_VISIBLE_DEVICES=all` in
   docker/worker-stack.yml) gets the GPUs, and point the toolkit's `swarm-resource` at
   `DOCKER_RESOURCE_NVIDIA-GPU`, so a service reserving GPUs gets only the ones swarm gave it;
3. restart dockerd (`systemctl restart docker`): node generic resources are read at start only.

A machine without `nvidia-smi` (a GPU type on an AMI without the driver) changes nothing: swarm never
places a GPU service there, and docs/deployment.md says which AMIs to use. A failure (nvidia-smi or the
restart failing) fails the boot, which then says so on the console (`adapters.boot_scripts`).
"""

from __future__ import annotations

GPU_KIND = "NVIDIA-GPU"  # the swarm generic resource kind of a GPU (the dynamic mode counts it as GPUs)
DOCKERD_CONFIG = "/etc/docker/daemon.json"
TOOLKIT_CONFIG = "/etc/nvidia-container-runtime/config.toml"
SWARM_RESOURCE_ENV = f"DOCKER_RESOURCE_{GPU_KIND}"  # what swarm names the env of a task's GPUs

_MERGE = """import json, shutil, subprocess, sys
path, count = sys.argv[1], int(sys.argv[2])
out = subprocess.run(["nvidia-smi", "--query-gpu=uuid", "--format=csv,noheader"],
                     check=True, capture_output=True, text=True).stdout
ids = [line.strip() for line in out.splitlines() if line.strip()][:count]
try:
    with open(path) as f:
        conf = json.load(f)
except FileNotFoundError:
    conf = {}
conf["node-generic-resources"] = ["__KIND__=" + i for i in ids]
runtime = shutil.which("nvidia-container-runtime")
if runtime:
    conf.setdefault("runtimes", {})["nvidia"] = {"path": runtime, "runtimeArgs": []}
    conf["default-runtime"] = "nvidia"
with open(path, "w") as f:
    json.dump(conf, f, indent=2)
print("swarm-autoscaler: GPUs for swarm:", " ".join(ids))
""".replace("__KIND__", GPU_KIND)


def gpu_dockerd_script(gpus: int) -> str:
    """Shell lines that give dockerd the machine's first `gpus` GPUs (module doc); empty for none."""
    if gpus <= 0:
        return ""
    return (
        "# the machine's GPUs to swarm and to its containers (added by swarm-autoscaler)\n"
        "if command -v nvidia-smi >/dev/null 2>&1; then\n"
        f"mkdir -p {DOCKERD_CONFIG.rsplit('/', 1)[0]}\n"
        f"python3 - {DOCKERD_CONFIG} {gpus} <<'SWARM_AUTOSCALER_EOF'\n{_MERGE}SWARM_AUTOSCALER_EOF\n"
        f"if [ -f {TOOLKIT_CONFIG} ]; then\n"
        f"    sed -i 's/^#* *swarm-resource *=.*/swarm-resource = \"{SWARM_RESOURCE_ENV}\"/' {TOOLKIT_CONFIG}\n"
        "fi\n"
        "systemctl restart docker\n"
        "fi\n"
    )
