"""One settings reference: every setting is declared once (ledgerweb/settings_reference.py), the
documents are generated from the declarations, code reads nothing undeclared, and the deployment
gate refuses the placeholder secrets an example file carries."""

import re
from pathlib import Path

import pytest
from django.core.exceptions import ImproperlyConfigured
from django.core.management import call_command

from ledgerweb import settings_reference as reference
from tests.conftest import REPO, child_env, manage

# Does not depend on the database: one pass runs it.
pytestmark = pytest.mark.one_database("postgres")

SERVER_PACKAGES = ("ledgerweb", "attempts", "reconciliation")
NAME = re.compile(r"\bLEDGERWEB_[A-Z0-9_]*[A-Z0-9]\b")
EXAMPLE_ENV = Path(REPO) / "deploy" / "ledgerweb.env.example"


def server_sources():
    for package in SERVER_PACKAGES:
        for path in sorted((Path(REPO) / package).rglob("*.py")):
            if path.name != "settings_reference.py":
                yield path


def test_the_generated_documents_match_the_declarations():
    # The command's own check: docs/settings.md and the README's table are what the
    # declarations generate today.
    call_command("settings_reference", "--check")
    text = (Path(REPO) / "docs" / "settings.md").read_text(encoding="utf-8")
    for setting in reference.REFERENCE.values():
        assert f"| `{setting.name}` |" in text


def test_the_check_fails_when_a_declaration_changes(monkeypatch):
    from django.core.management.base import CommandError

    changed = reference.Setting(
        "LEDGERWEB_STALE_AFTER", "int", 121, "changed", group="Ledger and reconciliation"
    )
    monkeypatch.setitem(reference.REFERENCE, "LEDGERWEB_STALE_AFTER", changed)
    with pytest.raises(CommandError, match="differ from ledgerweb/settings_reference.py"):
        call_command("settings_reference", "--check")


def test_code_reads_no_undeclared_ledgerweb_variable():
    undeclared = {
        f"{name} ({path.relative_to(REPO)})"
        for path in server_sources()
        for name in NAME.findall(path.read_text(encoding="utf-8"))
        if name not in reference.REFERENCE
    }
    assert not undeclared, "declare these in ledgerweb/settings_reference.py: " + ", ".join(
        sorted(undeclared)
    )


def test_the_example_environment_sets_only_declared_settings():
    names = {
        line.lstrip("#").split("=", 1)[0]
        for line in EXAMPLE_ENV.read_text().splitlines()
        if re.match(r"^#?[A-Z_]+=", line)
    }
    assert names and names <= set(reference.REFERENCE), names - set(reference.REFERENCE)


def test_every_declared_setting_is_read_somewhere():
    code = "\n".join(path.read_text(encoding="utf-8") for path in server_sources())
    unused = [name for name in reference.REFERENCE if f'"{name}"' not in code]
    assert not unused, f"declared but never read: {unused}"


def test_reading_an_undeclared_setting_is_refused():
    with pytest.raises(ImproperlyConfigured, match="not declared"):
        reference.read("LEDGERWEB_NOT_A_SETTING")


def test_a_declared_choice_is_strict(monkeypatch):
    monkeypatch.setenv("LEDGERWEB_LOG_FORMAT", "xml")
    with pytest.raises(ImproperlyConfigured, match="LEDGERWEB_LOG_FORMAT must be one of"):
        reference.read("LEDGERWEB_LOG_FORMAT")


def test_a_name_cannot_be_declared_twice():
    with pytest.raises(ImproperlyConfigured, match="declared twice"):
        reference.declare("LEDGERWEB_BIND", "str", "", "again", group="Core")


def check_deploy(tmp_path, **env):
    base = child_env(LEDGERWEB_DATA_DIR=str(tmp_path), LEDGERWEB_SQLITE_PATH=str(tmp_path / "l.db"))
    base.pop("DATABASE_URL", None)
    base.update(env)
    return manage("check", "--deploy", "--fail-level", "WARNING", env=base)


GOOD_KEY = "Vt3o_q9ZkP0r7LxW2mYc8HfN5aJdE1sGbU4iKlR6nTzQwX-yAvBgMhOe"


def production(**overrides):
    env = {
        "LEDGERWEB_HTTPS": "1",
        "LEDGERWEB_SECRET_KEY": GOOD_KEY,
        "LEDGERWEB_DEFAULT_OWNER": "oncall",
        "LEDGERWEB_ALLOWED_HOSTS": "ledger.example.com",
        "LEDGERWEB_METRICS_TOKEN": "pR4e9Wm1sXq7ZbT0vNc3LkY8aHj2GdF6",
        "LEDGERWEB_TRUSTED_PROXIES": "127.0.0.1",
    }
    env.update(overrides)
    return env


def test_the_deploy_check_refuses_the_example_files_placeholders(tmp_path):
    example = {}
    for line in EXAMPLE_ENV.read_text().splitlines():
        if re.match(r"^[A-Z_]+=", line):
            name, value = line.split("=", 1)
            example[name] = value
    example.pop("DATABASE_URL")  # not reachable here; the check does not need it
    example["LEDGERWEB_DATA_DIR"] = str(tmp_path)
    result = check_deploy(tmp_path, **example)
    assert result.returncode != 0
    output = result.stdout + result.stderr
    assert "LEDGERWEB_SECRET_KEY is not a production secret" in output
    assert "LEDGERWEB_METRICS_TOKEN is not a production secret" in output
    assert "placeholder" in output


@pytest.mark.parametrize(
    ("name", "value", "why"),
    [
        ("LEDGERWEB_METRICS_TOKEN", "s3cr3t-but-short", "characters long"),
        ("LEDGERWEB_SECRET_KEY", "x7Jq-" * 12, "distinct characters"),
        ("LEDGERWEB_OIDC_CLIENT_SECRET", "changeme", "placeholder"),
    ],
)
def test_the_deploy_check_refuses_short_or_uniform_secrets(tmp_path, name, value, why):
    env = production(**{name: value})
    if name.startswith("LEDGERWEB_OIDC"):
        env.update(
            LEDGERWEB_OIDC_CLIENT_ID="ledgerweb",
            LEDGERWEB_OIDC_AUTHORIZATION_ENDPOINT="https://id.example.com/authorize",
            LEDGERWEB_OIDC_TOKEN_ENDPOINT="https://id.example.com/token",
            LEDGERWEB_OIDC_USERINFO_ENDPOINT="https://id.example.com/userinfo",
            LEDGERWEB_OIDC_JWKS_ENDPOINT="https://id.example.com/jwks",
        )
    result = check_deploy(tmp_path, **env)
    assert result.returncode != 0
    assert f"{name} is not a production secret" in result.stdout + result.stderr
    assert why in result.stdout + result.stderr


def test_random_secrets_pass_the_deploy_check(tmp_path):
    key = tmp_path / "log.key"
    made = manage(
        "ledger_log", "genkey", "--out", str(key), env=child_env(LEDGERWEB_DATA_DIR=str(tmp_path))
    )
    assert made.returncode == 0, made.stderr
    result = check_deploy(tmp_path, **production(LEDGERWEB_TLOG_KEY_FILE=str(key)))
    assert result.returncode == 0, result.stdout + result.stderr
    assert "no issues" in result.stdout


def test_only_generated_secrets_are_judged_by_length_and_variety():
    # A password another system chose (SMTP) is only checked for placeholders...
    assert reference.weak_secret("hunter2-smtp", None) is None
    assert "placeholder" in reference.weak_secret("change-me", None)
    # ...a key the operator generates must be long and random-looking.
    assert "characters long" in reference.weak_secret("s3cr3t-but-short", 32)
    assert "distinct characters" in reference.weak_secret("ab" * 40, 50)
    assert reference.weak_secret(GOOD_KEY, 50) is None


def test_the_deploy_check_warns_when_no_proxy_is_trusted_behind_https(tmp_path):
    result = check_deploy(tmp_path, **production(LEDGERWEB_TRUSTED_PROXIES=""))
    assert result.returncode != 0
    assert "attempts.W010" in result.stdout + result.stderr
