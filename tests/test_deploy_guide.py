"""docs/deploy.md walked as written: every ```sh block of the guide runs, in the guide's order,
in one bash session (a person at one terminal: what a block exports, the next one sees), with a
copy of the checkout whose wheel was built as the guide says, against a scratch PostgreSQL
database. A command that fails fails the test, and so does a check that reports something.

Blocks marked in the guide are not run, each for a reason of the machine the suite runs on:

- ```sh root: needs root, systemd or another operating-system user (useradd, chown, install -o,
  systemctl, sudo -u postgres): it would change the machine itself. The restore drill is one:
  it restores the dumps the backup timer wrote (tests/test_deploy.py runs it on a real dump).
- ```sh containers: needs a container engine with compose (tests/test_container.py builds and
  starts the image).

What the root blocks and the person do between the commands, the test does as they would:
- the paths under /opt/ledgerweb, /etc/ledgerweb and /var/lib/ledgerweb are folders of a
  scratch directory, and the test's own user is the service user (``sudo -u ledgerweb -E`` is
  dropped: it needs root and that user);
- ``/etc/ledgerweb/ledgerweb.env`` and ``ledger.toml`` are installed from deploy/ as section 3
  says, the environment's placeholders replaced by random secrets and ``DATABASE_URL`` naming
  the scratch database (section 2 creates the real one);
- ``python3`` is the suite's Python (3.12+; the guide says to find one);
- the packages of requirements.lock are the suite's own (a .pth file, put where the new
  virtualenv will have its packages, names a folder of links to them), so pip checks every pin
  of the lock against them, without the network;
- ``<new>`` in the upgrade block is the version this checkout builds.
"""

from __future__ import annotations

import os
import re
import secrets
import shutil
import subprocess
import sys
import sysconfig
import tomllib
from pathlib import Path

import psycopg
import pytest
from django.db import connection

from tests.conftest import REPO

GUIDE = REPO / "docs" / "deploy.md"
BLOCK = re.compile(r"^```(\w*)([^\n]*)\n(.*?)^```$", re.MULTILINE | re.DOTALL)
NOT_RUN = {"root", "containers"}  # the marks, and why, in the docstring above
SERVER = (
    os.environ.get("LEDGERWEB_TEST_DATABASE_URL") or "postgres://postgres@127.0.0.1:5432/postgres"
)
VERSION = tomllib.loads((REPO / "pyproject.toml").read_text())["project"]["version"]

pytestmark = [
    pytest.mark.slow,
    # The guide's database is its own scratch one: the walk runs once, on the SQLite pass,
    # where the wheel it installs is built for tests/test_packaging.py anyway.
    pytest.mark.skipif(
        bool(os.environ.get("DATABASE_URL")) or connection.vendor != "sqlite",
        reason="the walk makes its own PostgreSQL database; the SQLite pass runs it",
    ),
]


def blocks() -> list[tuple[int, str, set[str], str]]:
    """(line, language, marks, code) of every fenced block of the guide."""
    text = GUIDE.read_text(encoding="utf-8")
    return [
        (text[: m.start()].count("\n") + 1, m.group(1), set(m.group(2).split()), m.group(3))
        for m in BLOCK.finditer(text)
    ]


def walked() -> list[tuple[int, str]]:
    """The shell blocks the walk runs, (line, code), in order."""
    return [(line, code) for line, lang, marks, code in blocks() if lang == "sh" and not marks]


def test_every_block_of_the_guide_is_run_or_marked_with_a_known_reason() -> None:
    for line, language, marks, _code in blocks():
        assert language in ("sh", "yaml", ""), f"deploy.md:{line}: a {language} block"
        assert marks <= NOT_RUN, f"deploy.md:{line}: unknown marks {marks - NOT_RUN}"
    commands = "\n".join(code for _line, code in walked())
    for step in ("python3 -m venv", "--require-hashes", "genkey", "migrate", "createsuperuser"):
        assert step in commands, step
    assert "config apply" in commands and "check --deploy" in commands


@pytest.fixture
def scratch_database():
    """An empty PostgreSQL database of its own, dropped afterwards."""
    name = f"ledgerweb_deploy_walk_{secrets.token_hex(4)}"
    try:
        admin = psycopg.connect(SERVER, autocommit=True, connect_timeout=5)
    except psycopg.OperationalError as exc:
        pytest.skip(f"no PostgreSQL at {SERVER}: {exc}")
    with admin:
        admin.execute(f'CREATE DATABASE "{name}"')
        try:
            yield f"{SERVER.rsplit('/', 1)[0]}/{name}"
        finally:
            admin.execute(f'DROP DATABASE IF EXISTS "{name}" WITH (FORCE)')


def lock_packages(root: Path) -> Path:
    """A folder of links to the suite's installed packages, for the new virtualenv to find them
    installed: not pip (the virtualenv gets its own) and not the checkout's own ledgerweb
    (installed editable; the guide installs the wheel)."""
    folder = root / "lock-packages"
    folder.mkdir()
    for entry in Path(sysconfig.get_path("purelib")).iterdir():
        name = entry.name
        if name in ("pip", "__pycache__") or name.startswith(("pip-", "__editable__", "ledgerweb")):
            continue
        if entry.suffix != ".pth":
            (folder / name).symlink_to(entry)
    return folder


def test_the_guide_runs_as_written(built_checkout: Path, scratch_database: str, tmp_path) -> None:
    root = tmp_path / "machine"
    paths = {
        "/opt/ledgerweb": root / "opt" / "ledgerweb",
        "/etc/ledgerweb": root / "etc" / "ledgerweb",
        "/var/lib/ledgerweb": root / "var" / "lib" / "ledgerweb",
    }

    def here(text: str) -> str:
        for production, scratch in paths.items():
            text = text.replace(production, str(scratch))
        return text

    for folder in paths.values():
        folder.mkdir(parents=True)
    # Section 3's root block, and the person's edits of the example environment.
    environment = here((REPO / "deploy" / "ledgerweb.env.example").read_text())
    for name, value in {
        "DATABASE_URL": scratch_database,
        "LEDGERWEB_SECRET_KEY": secrets.token_urlsafe(64),
        "LEDGERWEB_METRICS_TOKEN": secrets.token_urlsafe(32),
    }.items():
        environment, found = re.subn(rf"^{name}=.*$", f"{name}={value}", environment, flags=re.M)
        assert found == 1, name
    (paths["/etc/ledgerweb"] / "ledgerweb.env").write_text(environment)
    shutil.copy(REPO / "deploy" / "ledger.toml", paths["/etc/ledgerweb"] / "ledger.toml")
    # A Python 3.12+ as python3, and the lock's packages where pip finds them installed.
    bin_dir = root / "usr" / "bin"
    bin_dir.mkdir(parents=True)
    (bin_dir / "python3").symlink_to(os.path.realpath(sys._base_executable))
    venv_packages = (
        paths["/opt/ledgerweb"]
        / "venv"
        / Path(sysconfig.get_path("purelib")).relative_to(sys.prefix)
    )
    venv_packages.mkdir(parents=True)
    (venv_packages / "_lock_from_the_suite.pth").write_text(f"{lock_packages(root)}\n")

    script = ["PS4='+ ${SECONDS}s '", "set -eo pipefail -x"]
    for line, code in walked():
        code = here(code).replace("sudo -u ledgerweb -E ", "").replace("<new>", VERSION)
        script += [f": docs/deploy.md line {line}", code]
    env = {
        "PATH": f"{bin_dir}{os.pathsep}/usr/bin{os.pathsep}/bin",
        "HOME": str(tmp_path),
        "LANG": "C.UTF-8",
        "PIP_DISABLE_PIP_VERSION_CHECK": "1",
        "PIP_NO_INDEX": "1",  # nothing from the network: every package is here already
    }
    done = subprocess.run(
        ["bash", "-c", "\n".join(script)],
        cwd=built_checkout,
        env=env,
        capture_output=True,
        text=True,
        timeout=300,
    )
    # bash -x traces each command on stderr, the failing one last.
    trace = f"{done.stdout[-3000:]}\n--- trace:\n{done.stderr[-4000:]}"
    assert done.returncode == 0, trace
    assert "System check identified no issues (0 silenced)." in done.stdout, trace
    links = re.findall(r"^https://ledger\.example\.com/\S+$", done.stdout, flags=re.M)
    assert len(links) == 2, done.stdout  # the administrator's and rita's one-time links

    # The wheel is what was installed (the checkout's own ledgerweb is not linked).
    assert "Successfully installed ledgerweb-" in done.stdout
    assert (venv_packages / "ledgerweb" / "cli.py").is_file()
    with psycopg.connect(scratch_database) as db:
        admin = db.execute("SELECT is_superuser FROM auth_user WHERE username = 'admin'").fetchone()
        assert admin == (True,)
        assert db.execute("SELECT 1 FROM auth_user WHERE username = 'rita'").fetchone()
        tokens = db.execute("SELECT name FROM attempts_agenttoken").fetchall()
        assert tokens == [("billing-agent",)]
    assert (paths["/etc/ledgerweb"] / "log_signing.key").stat().st_mode & 0o077 == 0
