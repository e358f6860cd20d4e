"""The container image (Dockerfile) builds and starts here: buildah builds it (chroot isolation,
vfs storage: what works on this machine as root) on a Python base made locally, because base
images cannot be pulled here; ``buildah run`` then migrates a SQLite ledger, starts ``serve``
and gets 200 from /healthz inside the container's run, as the image's unprivileged user.

The local base stands in for the official ``python:3.13-slim-bookworm`` that the published
Dockerfile names: a minimal Debian bookworm from Debian's packages (debootstrap) with this
machine's pyenv build of CPython 3.13 at /usr/local, as the official image has it. It is
selected with the Dockerfile's PYTHON_IMAGE build argument.

Both builds are slow (minutes) and run once per machine, not once per clone: the images are
kept outside the checkout (``container_cache()``: ``LEDGERWEB_CACHE_DIR``, else
``$XDG_CACHE_HOME/ledgerweb``, else /var/cache/ledgerweb as root, else ~/.cache/ledgerweb), each
tagged with the hash of its inputs and reused by every clone while those are unchanged. The
image's dependencies are a layer of their own, keyed by the lock file, so a change of the code
rebuilds only the layers after it. Each step's time is printed and kept in ``timings.json``
there.
"""

from __future__ import annotations

import contextlib
import fcntl
import hashlib
import json
import os
import secrets
import shutil
import socket
import subprocess
import tarfile
import threading
import time
from pathlib import Path

import pytest
import yaml
from django.db import connection

from tests.conftest import REPO, machine_cache

pytestmark = pytest.mark.slow


def container_cache() -> Path:
    """Where the images live between runs and clones: shared by every checkout on the machine,
    as each image is named by the hash of its inputs."""
    return machine_cache("containers")


CACHE = container_cache()
# What the build context lets in (.dockerignore's allowlist): their contents key the image.
CONTEXT = (
    "pyproject.toml",
    "requirements.lock",
    "README.md",
    "attempts",
    "ledgerweb",
    "ledgerweb_client",
    "reconciliation",
    "docs",
    "static",
    "templates",
    "deploy/container",
)
PYTHON_VERSION = "3.13"
SUITE = "bookworm"
MIRROR = "http://deb.debian.org/debian"
# The shared libraries CPython's modules link against (ssl, sqlite3, ctypes, readline, curses,
# dbm, uuid, expat), certificates, tzdata; the rest comes with debootstrap's minbase.
PACKAGES = (
    "ca-certificates",
    "libbz2-1.0",
    "libexpat1",
    "libffi8",
    "libgdbm-compat4",
    "libgdbm6",
    "liblzma5",
    "libncursesw6",
    "libreadline8",
    "libsqlite3-0",
    "libssl3",
    "libuuid1",
    "netbase",
    "tzdata",
    "zlib1g",
)
BASE_RECIPE = 1  # bump when local_base() changes what it makes


def buildah(*args: str, timeout: float = 1800, check: bool = True):
    command = [
        "buildah",
        "--root",
        str(CACHE / "storage"),
        "--runroot",
        str(CACHE / "run"),
        "--storage-driver",
        "vfs",
        *args,
    ]
    done = subprocess.run(command, capture_output=True, text=True, timeout=timeout)
    if check:
        assert done.returncode == 0, f"{args[:2]}\n{done.stdout[-3000:]}\n{done.stderr[-3000:]}"
    return done


@contextlib.contextmanager
def storage_lock():
    """One user of the image storage at a time (pytest-xdist may run these tests in parallel
    processes); whoever holds it may also clear working containers a killed run left behind,
    as every container lives only while its user holds the lock."""
    CACHE.mkdir(parents=True, exist_ok=True)
    with open(CACHE / "lock", "w") as lock:
        fcntl.flock(lock, fcntl.LOCK_EX)
        try:
            buildah("rm", "--all", check=False)
            yield
        finally:
            fcntl.flock(lock, fcntl.LOCK_UN)


def has_image(name: str) -> bool:
    return buildah("inspect", "--type", "image", name, check=False).returncode == 0


def record_time(step: str, seconds: float) -> None:
    path = CACHE / "timings.json"
    timings = json.loads(path.read_text()) if path.exists() else {}
    timings[step] = round(seconds, 1)
    path.write_text(json.dumps(timings, indent=2, sort_keys=True))
    print(f"container: {step} took {seconds:.0f} s")


def find_python_prefix() -> Path | None:
    """A CPython 3.13 build to put in the base: pyenv's (its root from PYENV_ROOT, ``pyenv
    root`` or ~/.pyenv), highest patch release first."""
    roots = [os.environ.get("PYENV_ROOT", "")]
    if pyenv := shutil.which("pyenv"):
        roots.append(subprocess.run([pyenv, "root"], capture_output=True, text=True).stdout.strip())
    roots.append(str(Path.home() / ".pyenv"))
    for root in filter(None, roots):
        builds = sorted(
            Path(root, "versions").glob(f"{PYTHON_VERSION}.*/bin/python{PYTHON_VERSION}"),
            key=lambda p: [int(n) for n in p.parent.parent.name.split(".") if n.isdigit()],
        )
        if builds:
            return builds[-1].parent.parent
    return None


def _python_files(prefix: Path, info: tarfile.TarInfo) -> tarfile.TarInfo | None:
    """What of the build goes into the image: the interpreter, its library and pip, not its
    test suite, static library or anything installed into it on this machine."""
    parts = Path(info.name).parts
    lib = f"python{PYTHON_VERSION}"
    if "__pycache__" in parts or info.name.endswith(".a"):
        return None
    if len(parts) >= 2 and parts[0] == "bin" and not parts[1].startswith("python"):
        return None  # pip, idle, pydoc: their #! lines name this machine's path
    if parts[:2] == ("lib", lib) and len(parts) > 2:
        if parts[2] in ("test", "idlelib", "turtledemo", "tkinter"):
            return None
        if parts[2] == "site-packages" and len(parts) > 3 and not parts[3].startswith("pip"):
            return None
    info.uid = info.gid = 0
    info.uname = info.gname = "root"
    return info


def local_base() -> str:
    """The base image, built once per recipe: debootstrap's minimal bookworm plus CPython."""
    prefix = find_python_prefix()
    if prefix is None:
        pytest.skip(f"no CPython {PYTHON_VERSION} build under pyenv to make the local base from")
    key = hashlib.sha256(
        json.dumps([BASE_RECIPE, SUITE, MIRROR, PACKAGES, prefix.name]).encode()
    ).hexdigest()[:16]
    name = f"localhost/ledgerweb-test-python:{prefix.name}-{SUITE}-{key}"
    if has_image(name):
        return name
    if shutil.which("debootstrap") is None:
        pytest.skip("debootstrap is missing (apt-get install debootstrap; .ci/run does)")
    work = CACHE / "base-work"
    shutil.rmtree(work, ignore_errors=True)
    rootfs = work / "rootfs"
    started = time.monotonic()
    done = subprocess.run(
        [
            "debootstrap",
            "--variant=minbase",
            f"--include={','.join(PACKAGES)}",
            SUITE,
            str(rootfs),
            MIRROR,
        ],
        capture_output=True,
        text=True,
        timeout=1800,
    )
    assert done.returncode == 0, done.stdout[-3000:] + done.stderr[-3000:]
    record_time("debootstrap", time.monotonic() - started)
    for cache in ("var/cache/apt/archives", "var/lib/apt/lists"):
        for item in (rootfs / cache).glob("*"):
            if item.is_file():
                item.unlink()
    # CPython at /usr/local, as in the official image; its RUNPATH names this machine's pyenv
    # folder, which the image lacks, so libpython is found through ld.so's cache.
    archive = work / "python.tar"
    with tarfile.open(archive, "w") as tar:
        for entry in sorted(prefix.iterdir()):
            tar.add(
                entry,
                arcname=entry.name,
                filter=lambda info: _python_files(prefix, info),
            )
    with tarfile.open(archive) as tar:
        tar.extractall(rootfs / "usr" / "local", filter="tar")
    for link, target in (("python3", f"python{PYTHON_VERSION}"), ("python", "python3")):
        path = rootfs / "usr" / "local" / "bin" / link
        if not path.exists():
            path.symlink_to(target)
    subprocess.run(["ldconfig", "-r", str(rootfs)], check=True)
    container = buildah("from", "scratch").stdout.strip()
    try:
        buildah("copy", container, f"{rootfs}/", "/")
        buildah(
            "config",
            "--env",
            "PATH=/usr/local/bin:/usr/local/sbin:/usr/sbin:/usr/bin:/sbin:/bin",
            "--env",
            "LANG=C.UTF-8",
            "--cmd",
            "python3",
            container,
        )
        buildah("commit", "--rm", container, name)
    finally:
        buildah("rm", container, check=False)
        shutil.rmtree(work, ignore_errors=True)
    record_time("local base image", time.monotonic() - started)
    return name


def context_hash(base: str) -> str:
    digest = hashlib.sha256(base.encode())
    for name in ("Dockerfile", ".dockerignore"):
        digest.update((REPO / name).read_bytes())
    listed = subprocess.run(
        ["git", "ls-files", "-z", "--cached", "--others", "--exclude-standard", *CONTEXT],
        cwd=REPO,
        capture_output=True,
        text=True,
        check=True,
    )
    for name in sorted(filter(None, listed.stdout.split("\0"))):
        path = REPO / name
        if path.is_file() and "__pycache__" not in path.parts:
            digest.update(name.encode() + b"\0" + path.read_bytes() + b"\0")
    return digest.hexdigest()[:16]


def host_ca_bundle() -> Path | None:
    """The CA bundle this machine trusts, for pip inside the build (PIP_CERT)."""
    for candidate in (os.environ.get("PIP_CERT"), os.environ.get("SSL_CERT_FILE")):
        if candidate and Path(candidate).is_file():
            return Path(candidate)
    default = Path("/etc/ssl/certs/ca-certificates.crt")
    return default if default.is_file() else None


@pytest.fixture(scope="module")
def image() -> str:
    if connection.vendor != "sqlite":
        pytest.skip("the image test runs once, on the SQLite pass (its ledger is SQLite)")
    if shutil.which("buildah") is None:
        pytest.skip("buildah is missing (apt-get install buildah; .ci/run does)")
    if os.geteuid() != 0:
        pytest.skip("buildah with chroot isolation and vfs storage needs root here")
    if thread := _prebuild.get("thread"):
        thread.join()  # type: ignore[attr-defined]
        if isinstance(_prebuild.get("error"), pytest.skip.Exception):
            raise _prebuild["error"]  # type: ignore[misc]
        if "image" in _prebuild:
            return str(_prebuild["image"])
    with storage_lock():
        return build_image()


def build_image() -> str:
    base = local_base()
    name = f"localhost/ledgerweb:test-{context_hash(base)}"
    if has_image(name):
        return name
    build = [
        "bud",
        "--isolation",
        "chroot",
        "--format",
        "docker",  # keeps HEALTHCHECK, which the OCI format has no field for
        # No intermediate layers: with vfs storage each one is a whole copy of the file system
        # (measured: a build with layers took longer than one without, even reusing some).
        "--layers=false",
        "--pull-never",
        "--build-arg",
        f"PYTHON_IMAGE={base}",
    ]
    if ca := host_ca_bundle():
        build += [
            "--volume",
            f"{ca}:/run/host-ca.pem:ro",
            "--build-arg",
            "PIP_CERT=/run/host-ca.pem",
        ]
    started = time.monotonic()
    buildah(*build, "--tag", name, "--file", str(REPO / "Dockerfile"), str(REPO))
    record_time("image build", time.monotonic() - started)
    # Older builds of the image are of no further use; vfs keeps whole copies.
    listed = buildah("images", "--format", "{{.Name}}:{{.Tag}}").stdout.split()
    for old in listed:
        if old.startswith("localhost/ledgerweb:test-") and old != name:
            buildah("rmi", old, check=False)
    buildah("rmi", "--prune", check=False)  # the untagged leftovers of earlier builds
    return name


_prebuild: dict[str, object] = {}


def start_prebuild() -> None:
    """Start building the base and the image in a thread at the start of the suite, so the
    minutes they take (mostly copying files and downloading) overlap the other tests instead of
    adding to them; the ``image`` fixture waits for it. Called by tests/conftest.py when a test
    of this file is selected on the SQLite pass."""
    if _prebuild or shutil.which("buildah") is None or os.geteuid() != 0:
        return

    def build() -> None:
        try:
            with storage_lock():
                _prebuild["image"] = build_image()
        except BaseException as exc:  # noqa: BLE001 - reported by the fixture that waits
            _prebuild["error"] = exc

    thread = threading.Thread(target=build, name="container-prebuild", daemon=True)
    _prebuild["thread"] = thread
    thread.start()


def finish_prebuild() -> None:
    """The suite's end waits for a build still running: nothing it started outlives it."""
    thread = _prebuild.get("thread")
    if isinstance(thread, threading.Thread):
        thread.join()


def free_port() -> int:
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return sock.getsockname()[1]


def run_in_container(image: str, port: int, script: str) -> subprocess.CompletedProcess[str]:
    container = buildah("from", "--pull-never", image).stdout.strip()
    try:
        ran = buildah(
            "run",
            "--isolation",
            "chroot",
            "--env",
            f"LEDGERWEB_BIND=127.0.0.1:{port}",
            "--env",
            "LEDGERWEB_WORKERS=1",
            # As in production behind the TLS proxy: the healthcheck must get past the host
            # check and the HTTPS redirect.
            "--env",
            "LEDGERWEB_HTTPS=1",
            "--env",
            "LEDGERWEB_ALLOWED_HOSTS=ledger.example.com",
            "--env",
            f"LEDGERWEB_SECRET_KEY={secrets.token_urlsafe(64)}",
            "--",
            container,
            "sh",
            "-c",
            script,
            timeout=300,
        )
    finally:
        buildah("rm", container, check=False)
    return ran


def test_the_image_describes_one_unprivileged_image_with_a_healthcheck(image) -> None:
    config = json.loads(buildah("inspect", "--type", "image", image).stdout)
    docker = config["Docker"]["config"]
    assert docker["User"] == "10001:10001"
    assert docker["Entrypoint"] == ["ledgerweb-entrypoint"] and docker["Cmd"] == ["serve"]
    assert docker["Healthcheck"]["Test"] == ["CMD", "ledgerweb-entrypoint", "healthcheck"]
    assert "8000/tcp" in docker["ExposedPorts"]


def test_the_image_migrates_serves_and_answers_healthz(image) -> None:
    """Inside one ``buildah run``, configured as behind the TLS proxy: the image's user, migrate,
    the worker's single pass, serve in the background, the image's own HEALTHCHECK command, then
    /healthz."""
    port = free_port()
    script = f"""
set -eu
echo "uid $(id -u)"
ledgerweb-entrypoint migrate >/dev/null
ledgerweb-entrypoint worker --once >/dev/null
ledgerweb-entrypoint demo --help >/dev/null
ledgerweb-entrypoint serve >serve.log 2>&1 &
server=$!
healthy=no
for i in $(seq 1 120); do
  if ledgerweb-entrypoint healthcheck 2>/dev/null; then healthy=yes; break; fi
  sleep 0.5
done
echo "healthcheck $healthy"
python3 -c "import urllib.request as u; r = u.urlopen(u.Request('http://127.0.0.1:{port}/healthz', \
headers={{'Host': 'ledger.example.com', 'X-Forwarded-Proto': 'https'}})); \
print('healthz', r.status, r.read().decode())" || tail -n 40 serve.log
kill $server
wait $server || true
"""
    with storage_lock():
        ran = run_in_container(image, port, script)
    lines = ran.stdout.splitlines()
    assert "uid 10001" in lines, ran.stdout
    assert "healthcheck yes" in lines, ran.stdout + ran.stderr
    healthz = [line for line in lines if line.startswith("healthz ")]
    assert healthz and healthz[0].startswith("healthz 200 "), ran.stdout + ran.stderr


def test_compose_runs_postgres_a_one_shot_migrate_web_and_worker() -> None:
    text = (REPO / "compose.yaml").read_text()
    compose = yaml.safe_load(text)
    services = compose["services"]
    assert set(services) == {"postgres", "migrate", "web", "worker", "backup"}
    assert "Docker Compose 2.24.0 or newer" in text  # the minimum version is named
    assert services["postgres"]["image"].startswith("docker.io/library/postgres:")
    assert "healthcheck" in services["postgres"]
    for name in ("migrate", "web", "worker"):
        service = services[name]
        assert service["build"]["context"] == "."
        assert service["volumes"] == ["ledgerweb-data:/var/lib/ledgerweb"]
        # Secrets come from files compose mounts, never from environment values.
        environment = service["environment"]
        assert not {"DATABASE_URL", "LEDGERWEB_SECRET_KEY", "POSTGRES_PASSWORD"} & set(environment)
        assert environment["LEDGERWEB_TLOG_KEY_FILE"] == "/run/secrets/log_signing.key"
    assert services["migrate"]["command"] == ["migrate"]
    assert services["migrate"]["restart"] == "no"
    assert services["migrate"]["depends_on"]["postgres"]["condition"] == "service_healthy"
    for name, command in (("web", ["serve"]), ("worker", ["worker"])):
        assert services[name]["command"] == command
        assert services[name]["depends_on"]["migrate"]["condition"] == (
            "service_completed_successfully"
        )
        assert services[name]["stop_grace_period"]
    # The worker's health is its heartbeat; the web tier's is its own readiness.
    assert services["worker"]["healthcheck"]["test"] == [
        "CMD",
        "ledgerweb-entrypoint",
        "healthcheck",
        "worker",
    ]
    assert services["web"]["healthcheck"]["test"] == ["CMD", "ledgerweb-entrypoint", "healthcheck"]
    assert services["worker"]["stop_grace_period"] == "60s"  # as the systemd unit allows
    # Every *_FILE names a secret the service mounts, and every secret is a file.
    declared = compose["secrets"]
    for name, service in services.items():
        mounted = set(service.get("secrets", []))
        assert mounted <= set(declared), name
        for variable, value in service.get("environment", {}).items():
            if variable.endswith("_FILE") and str(value).startswith("/run/secrets/"):
                assert value.removeprefix("/run/secrets/") in mounted, (name, variable)
    assert all(secret["file"].startswith("./secrets/") for secret in declared.values())
    assert services["postgres"]["environment"]["POSTGRES_PASSWORD_FILE"] == (
        "/run/secrets/postgres_password"
    )
    # Backups: a profile of their own, with a schedule.
    backup = services["backup"]
    assert backup["profiles"] == ["backup"]
    assert backup["environment"]["BACKUP_INTERVAL_SECONDS"] == "${BACKUP_INTERVAL_SECONDS:-86400}"
    assert "pg_dump" in backup["command"][0]
    # Each command compose names is one the entrypoint knows.
    entrypoint = (REPO / "deploy" / "container" / "entrypoint").read_text()
    for command in ("serve", "worker", "migrate", "demo", "healthcheck"):
        assert f"{command})" in entrypoint or f"{command}|" in entrypoint, command
    assert '"${1:-}" = worker' in entrypoint and "worker_health" in entrypoint


def test_the_build_context_is_the_dockerignore_allowlist() -> None:
    lines = (REPO / ".dockerignore").read_text().splitlines()
    allowed = [line[1:] for line in lines if line.startswith("!")]
    assert "*" in lines and tuple(allowed) == CONTEXT
