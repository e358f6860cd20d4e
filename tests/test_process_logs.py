"""Every process logs JSON when LEDGERWEB_LOG_FORMAT=json (gunicorn's error and access lines,
the worker's own lines), and gunicorn's control socket lives in the data folder, not in the
home directory every instance on the machine would share."""

from __future__ import annotations

import json
import os
import signal
import subprocess
import time
import urllib.request
from pathlib import Path

import pytest

from tests.conftest import PYTHON, REPO, child_env, free_port, start_manage

pytestmark = pytest.mark.django_db(transaction=True)


def json_lines(text: str) -> list[dict]:
    lines = [line for line in text.splitlines() if line.strip()]
    parsed = []
    for line in lines:
        try:
            parsed.append(json.loads(line))
        except ValueError:
            pytest.fail(f"not a JSON line: {line!r}\nin:\n{text}")
    return parsed


def stop(process: subprocess.Popen) -> None:
    process.send_signal(signal.SIGTERM)
    try:
        process.wait(timeout=30)
    except subprocess.TimeoutExpired:
        process.kill()
        process.wait()


def test_gunicorn_logs_json_and_keeps_its_control_socket_in_the_data_folder(tmp_path):
    home, data = tmp_path / "home", tmp_path / "data"
    home.mkdir()
    port = free_port()
    env = child_env(
        HOME=str(home),
        LEDGERWEB_DATA_DIR=str(data),
        LEDGERWEB_BIND=f"127.0.0.1:{port}",
        LEDGERWEB_WORKERS="1",
        LEDGERWEB_THREADS="1",
        LEDGERWEB_LOG_FORMAT="json",
        LEDGERWEB_HEALTHZ_REQUIRE_WORKER="0",
    )
    env.pop("XDG_RUNTIME_DIR", None)
    out, err = tmp_path / "out.log", tmp_path / "err.log"
    with open(out, "wb") as stdout, open(err, "wb") as stderr:
        process = subprocess.Popen(
            [PYTHON, "-m", "ledgerweb", "serve", "--skip-collectstatic"],
            cwd=REPO,
            env=env,
            stdout=stdout,
            stderr=stderr,
            start_new_session=True,
        )
    try:
        deadline = time.monotonic() + 60
        while True:
            try:
                with urllib.request.urlopen(f"http://127.0.0.1:{port}/healthz", timeout=2) as r:  # noqa: S310
                    assert r.status == 200
                    break
            except OSError:
                assert process.poll() is None, err.read_text()
                assert time.monotonic() < deadline, err.read_text()
                time.sleep(0.2)
        probe = urllib.request.Request(
            f"http://127.0.0.1:{port}/healthz", headers={"X-Request-ID": "probe-7"}
        )
        with urllib.request.urlopen(probe, timeout=5) as r:  # noqa: S310
            assert r.headers["X-Request-ID"] == "probe-7"
        control = data / "gunicorn.ctl"
        deadline = time.monotonic() + 20
        while not control.exists() and time.monotonic() < deadline:
            time.sleep(0.1)
        assert control.is_socket(), sorted(os.listdir(data))
        assert (control.stat().st_mode & 0o777) == 0o600
    finally:
        stop(process)
    assert not (home / ".gunicorn").exists()
    access = [e for e in json_lines(out.read_text()) if e.get("path") == "/healthz"]
    assert access, out.read_text()
    line = access[-1]
    assert line["logger"] == "gunicorn.access" and line["method"] == "GET"
    assert line["status"] == "200" and isinstance(line["duration_ms"], int)
    assert line["remote_addr"] == "127.0.0.1"
    # The access line names the request's id as the server answered it.
    assert line["request_id"] == "probe-7"
    errors = json_lines(err.read_text())
    assert any("Listening at" in e["message"] for e in errors), errors
    # Python's own warnings (no static files collected in this scratch folder) too.
    assert any(e["logger"] == "py.warnings" for e in errors), errors


def test_the_workers_own_lines_are_json(tmp_path):
    env = child_env(LEDGERWEB_DATA_DIR=str(tmp_path), LEDGERWEB_LOG_FORMAT="json")
    process = start_manage(
        ["reconcile", "--interval", "0.2", "--no-notify"],
        env=env,
    )
    first = process.stdout.readline()
    stop(process)
    rest, errors = process.communicate(timeout=30)
    lines = json_lines(first + rest)
    assert lines[0]["event"] == "worker.started" and lines[0]["worker_id"]
    assert lines[-1]["event"] == "worker.finished" and lines[-1]["stopped"] is True
    assert "claimed" in lines[-1] and "seconds" in lines[-1]
    json_lines(errors)  # warnings too (no owner configured: attempts.W001) are JSON


def test_the_control_socket_can_be_turned_off_or_moved(tmp_path):
    def settings_of(**env):
        code = (
            "import runpy,json; c=runpy.run_path('ledgerweb/gunicorn.conf.py');"
            "print(json.dumps({k:c.get(k) for k in ('control_socket','control_socket_disable')}))"
        )
        done = subprocess.run(
            [PYTHON, "-c", code],
            cwd=REPO,
            env=child_env(LEDGERWEB_DATA_DIR=str(tmp_path), **env),
            capture_output=True,
            text=True,
            timeout=60,
        )
        assert done.returncode == 0, done.stderr
        return json.loads(done.stdout)

    assert settings_of() == {
        "control_socket": str(Path(tmp_path).resolve() / "gunicorn.ctl"),
        "control_socket_disable": None,
    }
    assert settings_of(LEDGERWEB_CONTROL_SOCKET="off")["control_socket_disable"] is True
    assert settings_of(LEDGERWEB_CONTROL_SOCKET="/run/x.ctl")["control_socket"] == "/run/x.ctl"
