"""The daemon's image, built on this machine without a registry (`make image`, and the stack test).

Steps, each cached under `build/` (ignored by git):
1. a Debian base root filesystem from Debian packages (`mmdebstrap`, installed with apt when missing):
   python3 and its venv module, nothing else (`build/image/debian-base.tar`);
2. the runtime's wheels, built on the host with `pip wheel` (`build/wheels/`), so the image installs
   them without a network (containers have none here: dockerd runs with `--bridge=none`);
3. on a dockerd the project started (a `LocalNode`): `docker import` of the base, then
   `docker build -f docker/Dockerfile --build-arg BASE=<the base>` with `--network none`;
4. `docker save` to `build/image/runtime-<key>.tar` (`debug-<key>.tar` with debugpy), where the key hashes every input of the
   image (Dockerfile, pyproject.toml, README.md, src/): the next run loads that file instead of building.

Contract: `ensure_image(node)` leaves `IMAGE` loaded in `node`'s dockerd and returns its size in bytes.

The team worker image (`ensure_worker_image`, `WORKER_IMAGE`): docker/worker.Dockerfile as a team would
build it, on the same Debian base (python 3.11) with `distributed` from the same wheels and our
entrypoint script, and nothing of swarm-autoscaler; the e2e suite pushes it to a local registry
(`localcloud.registry`) and runs the worker service from it. Cached as `build/image/worker-<key>.tar`.
"""

from __future__ import annotations

import asyncio
import hashlib
import shutil
import subprocess
import sys
import tempfile
from pathlib import Path

from swarm_autoscaler.errors import ConfigurationError
from swarm_autoscaler_lab.localcloud.dockerd import LocalNode, LocalSwarm, _cli_env, _docker_cli

ROOT = Path(__file__).resolve().parents[3]
BUILD = ROOT / "build"
IMAGE = "swarm-autoscaler:local"
WORKER_IMAGE = "team-dask-worker:local"  # docker/worker.Dockerfile: distributed, no swarm_autoscaler
BASE_IMAGE = "swarm-autoscaler-base:bookworm"
SUITE = "bookworm"  # the host's Debian: the wheels built here match its python3 (3.11)
MIRRORS = (
    f"deb http://deb.debian.org/debian {SUITE} main",
    f"deb http://deb.debian.org/debian-security {SUITE}-security main",
)
BUILD_BACKEND = "hatchling==1.33.0"  # pyproject's build backend: the image builds the package offline
# Wheels the image's python (Debian's 3.11.2) needs but the host's may not: redis wants async-timeout
# below 3.11.3.
FOR_DEBIAN_PYTHON = ("async-timeout>=4.0.3",)
_DROP = ("man", "doc", "locale", "info", "lintian", "bash-completion")


def _run(cmd: list[str], what: str, cwd: Path = ROOT, timeout: float = 900) -> str:
    done = subprocess.run(cmd, cwd=cwd, capture_output=True, text=True, timeout=timeout, check=False)
    if done.returncode != 0:
        tail = "\n".join((done.stdout + done.stderr).strip().splitlines()[-15:])
        raise ConfigurationError(f"{what} failed ({' '.join(cmd[:3])} ...):\n{tail}")
    return done.stdout


def base_rootfs(path: Path | None = None) -> Path:
    """The Debian base as a tar of its root filesystem (built once, then reused)."""
    path = path or BUILD / "image" / "debian-base.tar"
    if path.exists():
        return path
    if shutil.which("mmdebstrap") is None:
        _run(["apt-get", "install", "-y", "-qq", "--no-install-recommends", "mmdebstrap"], "apt-get install")
    path.parent.mkdir(parents=True, exist_ok=True)
    partial = path.with_name(path.stem + ".partial.tar")  # mmdebstrap picks the format by the suffix
    excludes = [f"--dpkgopt=path-exclude=/usr/share/{d}/*" for d in _DROP]
    _run(
        [
            "mmdebstrap", "--variant=essential", "--mode=root", "--include=python3,python3-venv",
            # merged /usr without the usrmerge package, which pulls in perl (~50 MB)
            "--hook-dir=/usr/share/mmdebstrap/hooks/merged-usr",
            "--aptopt=APT::Install-Recommends \"false\"", "--aptopt=Acquire::Languages \"none\"",
            *excludes, "--dpkgopt=path-include=/usr/share/doc/*/copyright",
            "--customize-hook=rm -rf \"$1\"/var/lib/apt/lists/* \"$1\"/var/cache/* \"$1\"/var/log/*",
            SUITE, str(partial), *MIRRORS,
        ],
        "mmdebstrap",
    )  # fmt: skip
    partial.rename(path)
    return path


def wheelhouse(folder: Path | None = None) -> Path:
    """Every wheel the image installs (runtime and the debug extra) plus the build backend, built on the
    host; rebuilt when pyproject.toml changes. The project's own wheel is dropped: the image builds it."""
    folder = folder or BUILD / "wheels"
    stamp = folder / ".pyproject-sha256"
    key = hashlib.sha256((ROOT / "pyproject.toml").read_bytes()).hexdigest()
    if stamp.exists() and stamp.read_text() == key:
        return folder
    shutil.rmtree(folder, ignore_errors=True)
    folder.mkdir(parents=True)
    pip = [sys.executable, "-m", "pip", "--disable-pip-version-check"]
    _run(
        [*pip, "wheel", "--quiet", "-w", str(folder), f"{ROOT}[debug]", BUILD_BACKEND, *FOR_DEBIAN_PYTHON],
        "pip wheel",
    )
    for own in folder.glob("swarm_autoscaler-*.whl"):
        own.unlink()
    stamp.write_text(key)
    return folder


def image_key(debug: bool = False) -> str:
    """A hash of every input of the image, so a cached tarball is reused only for the same inputs."""
    digest = hashlib.sha256(b"debug" if debug else b"runtime")
    files = [
        ROOT / "docker" / "Dockerfile",
        ROOT / "docker" / "worker-entrypoint.sh",
        ROOT / "docker" / "autoscaler-entrypoint.sh",
        ROOT / ".dockerignore",
        ROOT / "pyproject.toml",
        ROOT / "README.md",
    ]
    files += sorted(p for p in (ROOT / "src").rglob("*") if p.is_file() and "__pycache__" not in p.parts)
    for path in files:
        digest.update(str(path.relative_to(ROOT)).encode() + b"\0" + path.read_bytes() + b"\0")
    return digest.hexdigest()[:16]


def build_image(node: LocalNode, tag: str = IMAGE, debug: bool = False) -> None:
    """`docker import` the Debian base and `docker build` docker/Dockerfile on it, offline."""
    base = base_rootfs()
    wheelhouse()
    node.docker_sync("import", str(base), BASE_IMAGE, timeout=300)
    env = {**_cli_env(), "DOCKER_BUILDKIT": "0"}  # the classic builder: no BuildKit daemon needed
    cmd = [
        _docker_cli(), "-H", node.docker_url, "build", "--network", "none", "--quiet",
        "-f", "docker/Dockerfile", "--build-arg", f"BASE={BASE_IMAGE}",
        "--build-arg", f"DEBUG={int(debug)}", "-t", tag, ".",
    ]  # fmt: skip
    done = subprocess.run(cmd, cwd=ROOT, capture_output=True, text=True, env=env, timeout=900, check=False)
    if done.returncode != 0:
        tail = "\n".join((done.stdout + done.stderr).strip().splitlines()[-20:])
        raise ConfigurationError(f"docker build failed:\n{tail}")


def image_tarball(debug: bool = False) -> Path:
    """Where `ensure_image` caches the image for the current inputs (`docker load` it into a new node)."""
    flavour = "debug" if debug else "runtime"
    return BUILD / "image" / f"{flavour}-{image_key(debug)}.tar"


def ensure_image(node: LocalNode, tag: str = IMAGE, debug: bool = False) -> int:
    """Load the cached image for the current inputs into `node`, or build and cache it; its size in bytes."""
    flavour = "debug" if debug else "runtime"
    cache = image_tarball(debug)
    if cache.exists():
        node.docker_sync("load", "-i", str(cache), timeout=300)
    else:
        build_image(node, tag, debug)
        for old in cache.parent.glob(f"{flavour}-*.tar"):
            old.unlink()
        partial = cache.with_suffix(".partial")
        node.docker_sync("save", "-o", str(partial), tag, timeout=300)
        partial.rename(cache)
    return int(node.docker_sync("image", "inspect", "-f", "{{.Size}}", tag))


def worker_image_key() -> str:
    """A hash of the team worker image's inputs (its Dockerfile, the entrypoint, the pinned wheels)."""
    digest = hashlib.sha256(b"worker")
    for path in (
        ROOT / "docker" / "worker.Dockerfile",
        ROOT / "docker" / "worker-entrypoint.sh",
        ROOT / ".dockerignore",
        ROOT / "pyproject.toml",
    ):
        digest.update(path.name.encode() + b"\0" + path.read_bytes() + b"\0")
    return digest.hexdigest()[:16]


def ensure_worker_image(node: LocalNode, tag: str = WORKER_IMAGE) -> int:
    """Load the cached team worker image into `node`, or build it from docker/worker.Dockerfile (offline,
    on the Debian base, `distributed` from the wheelhouse) and cache it; its size in bytes."""
    cache = BUILD / "image" / f"worker-{worker_image_key()}.tar"
    if cache.exists():
        node.docker_sync("load", "-i", str(cache), timeout=300)
    else:
        base = base_rootfs()
        wheelhouse()
        node.docker_sync("import", str(base), BASE_IMAGE, timeout=300)
        env = {**_cli_env(), "DOCKER_BUILDKIT": "0"}
        cmd = [
            _docker_cli(), "-H", node.docker_url, "build", "--network", "none", "--quiet",
            "-f", "docker/worker.Dockerfile", "--build-arg", f"BASE={BASE_IMAGE}", "-t", tag, ".",
        ]  # fmt: skip
        done = subprocess.run(
            cmd, cwd=ROOT, capture_output=True, text=True, env=env, timeout=900, check=False
        )
        if done.returncode != 0:
            tail = "\n".join((done.stdout + done.stderr).strip().splitlines()[-20:])
            raise ConfigurationError(f"docker build of the worker image failed:\n{tail}")
        for old in cache.parent.glob("worker-*.tar"):
            old.unlink()
        partial = cache.with_suffix(".partial")
        node.docker_sync("save", "-o", str(partial), tag, timeout=300)
        partial.rename(cache)
    return int(node.docker_sync("image", "inspect", "-f", "{{.Size}}", tag))


async def _main(debug: bool) -> int:
    """`make image`: a one-node local swarm (the only dockerd the project starts), the image, teardown."""
    with tempfile.TemporaryDirectory(prefix="swarm-autoscaler-image-") as tmp:
        async with LocalSwarm(Path(tmp) / "swarm") as swarm:
            node = await swarm.start_manager("image-builder")
            size = await asyncio.to_thread(ensure_image, node, IMAGE, debug)
    flavour = "debug" if debug else "runtime"
    print(f"{IMAGE}: {size / 1e6:.0f} MB; saved in {BUILD / 'image'} ({flavour}-{image_key(debug)}.tar)")
    print(
        f"load it into a docker engine with: docker load -i {BUILD / 'image'}/{flavour}-{image_key(debug)}.tar"
    )
    return 0


def prepare() -> int:
    """`--prepare`: the inputs every image build shares, the Debian base and the wheelhouse, cached under
    `build/`. They need no dockerd, so `make test` (scripts/test-lanes.sh) makes them while other tests
    run, before the e2e suite builds the images from them (~80 s on a fresh clone, mostly downloads)."""
    print(f"Debian base: {base_rootfs()}; wheels: {wheelhouse()}")
    return 0


if __name__ == "__main__":
    if "--prepare" in sys.argv[1:]:
        raise SystemExit(prepare())
    from swarm_autoscaler_lab.localcloud.dockerd import require_install

    require_install()
    raise SystemExit(asyncio.run(_main(debug="--debug" in sys.argv[1:])))
