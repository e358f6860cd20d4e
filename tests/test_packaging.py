"""The server as a package: the built wheel installed into a fresh virtualenv gives a
``ledgerweb`` command that works outside the checkout, with its data in LEDGERWEB_DATA_DIR and
its templates, static files and published documents inside the package."""

from __future__ import annotations

import os
import subprocess
import time
import tomllib
import urllib.error
import urllib.request
import venv
from pathlib import Path

import pytest
from django.db import connection

from tests.conftest import REPO, free_port, pip_install

PROJECT = tomllib.loads((REPO / "pyproject.toml").read_text())


def test_every_folder_the_server_needs_is_in_the_package_list() -> None:
    listed = set(PROJECT["tool"]["setuptools"]["packages"])
    mapped = PROJECT["tool"]["setuptools"]["package-dir"]
    needed = {
        ".".join(init.parent.relative_to(REPO).parts)
        for app in ("attempts", "reconciliation", "ledgerweb", "ledgerweb_client")
        for init in (REPO / app).rglob("__init__.py")
    }
    for folder in ("templates", "static"):
        for sub in [REPO / folder, *[p for p in (REPO / folder).rglob("*") if p.is_dir()]]:
            if any(f.is_file() for f in sub.iterdir()):
                needed.add(".".join(("ledgerweb", *sub.relative_to(REPO).parts)))
    assert needed - listed == set(), "add these to [tool.setuptools] packages"
    for package, folder in mapped.items():
        assert (REPO / folder).is_dir(), (package, folder)


def get(url: str) -> tuple[int, str]:
    try:
        with urllib.request.urlopen(url, timeout=10) as answer:  # noqa: S310 (127.0.0.1)
            return answer.status, answer.read().decode()
    except urllib.error.HTTPError as exc:
        return exc.code, exc.read().decode(errors="replace")


@pytest.mark.slow
@pytest.mark.skipif(
    bool(os.environ.get("DATABASE_URL")) or connection.vendor != "sqlite",
    reason="packaging does not depend on the database; the SQLite pass covers it",
)
def test_the_wheel_runs_outside_the_checkout(tmp_path: Path, built_checkout: Path) -> None:
    (wheel,) = (built_checkout / "dist").glob("ledgerweb-*.whl")

    target = tmp_path / "venv"
    venv.EnvBuilder(with_pip=True, clear=True).create(target)
    pip_install(target / "bin" / "python", str(wheel), timeout=600)

    outside = tmp_path / "somewhere-else"
    outside.mkdir()
    data = tmp_path / "data"
    port = free_port()
    env = {
        k: v
        for k, v in os.environ.items()
        if not k.startswith(("LEDGERWEB_", "DATABASE_URL", "DJANGO", "PYTHON"))
    }
    env.update(
        LEDGERWEB_DATA_DIR=str(data),
        LEDGERWEB_BIND=f"127.0.0.1:{port}",
        LEDGERWEB_WORKERS="1",
        LEDGERWEB_INTENT_WRITER="0",
    )
    ledgerweb = str(target / "bin" / "ledgerweb")

    def run(*args: str) -> str:
        done = subprocess.run(
            [ledgerweb, *args], cwd=outside, env=env, capture_output=True, text=True, timeout=120
        )
        assert done.returncode == 0, (args, done.stdout + done.stderr)
        return done.stdout

    assert "ledgerweb serve" in run("--help")
    run("migrate", "--no-input", "-v", "0")
    assert (data / "ledger.sqlite3").is_file() and (data / "secret_key").is_file()
    where = run("shell", "-c", "import attempts, ledgerweb; print(attempts.__file__)")
    assert str(target) in where and str(REPO) not in where
    config_file = outside / "ledger.toml"
    config_file.write_text(
        'version = 1\n\n[[tenants]]\nslug = "acme"\n\n'
        '[[users]]\nusername = "ops"\nroles = { acme = "admin" }\n'
    )
    assert "2 created" in run("config", "apply", str(config_file), "--actor", "installer")
    assert 'slug = "acme"' in run("config", "dump")
    assert "usage:" in run("worker", "--help") and "usage:" in run("demo", "--help")
    run("worker", "--once")
    # The demo agents come along (they are agent code: they use the client).
    assert "usage:" in run("demo_agents", "--help")

    log = tmp_path / "serve.log"
    with open(log, "wb") as out:
        server = subprocess.Popen(
            [ledgerweb, "serve"], cwd=outside, env=env, stdout=out, stderr=subprocess.STDOUT
        )
    try:
        base = f"http://127.0.0.1:{port}"
        deadline = time.monotonic() + 60
        while True:
            try:
                status, page = get(f"{base}/login/")
                break
            except OSError:
                assert server.poll() is None, log.read_text()
                assert time.monotonic() < deadline, log.read_text()
                time.sleep(0.3)
        assert status == 200 and 'name="password"' in page  # templates from the package
        css = page.split('href="/static/css/', 1)[1].split('"', 1)[0]
        assert get(f"{base}/static/css/{css}")[0] == 200  # collected static files
        assert get(f"{base}/api/v1/openapi.json")[0] == 200  # the published description
    finally:
        server.terminate()
        server.wait(timeout=30)
