"""Release bookkeeping: CHANGELOG.md (Keep a Changelog), RELEASES.toml (each release's commit and
versions) and the version numbers in the code agree with each other and with the release
commits themselves."""

from __future__ import annotations

import json
import re
import subprocess
import tomllib

import pytest

from tests.conftest import REPO

SEMVER = re.compile(r"^(0|[1-9]\d*)\.(0|[1-9]\d*)\.(0|[1-9]\d*)$")
RELEASES = tomllib.loads((REPO / "RELEASES.toml").read_text())["release"]
CHANGELOG = (REPO / "CHANGELOG.md").read_text()
# Keep a Changelog's kinds of change, and the upgrade notes docs/deploy.md sends operators to.
KINDS = {"Added", "Changed", "Deprecated", "Removed", "Fixed", "Security", "Upgrade"}


def versions_in(read) -> dict[str, str]:
    """The four version numbers, each from the one file that states it."""
    return {
        "version": tomllib.loads(read("pyproject.toml"))["project"]["version"],
        "api": json.loads(read("docs/openapi.json"))["info"]["version"],
        "python_client": tomllib.loads(read("ledgerweb_client/pyproject.toml"))["project"][
            "version"
        ],
        "typescript_client": json.loads(read("clients/typescript/package.json"))["version"],
    }


def current() -> dict[str, str]:
    return versions_in(lambda name: (REPO / name).read_text())


def git(*args: str) -> subprocess.CompletedProcess[str]:
    return subprocess.run(["git", *args], cwd=REPO, capture_output=True, text=True, timeout=60)


def test_the_versions_of_the_code_agree() -> None:
    versions = current()
    assert all(SEMVER.match(v) for v in versions.values()), versions
    assert versions["python_client"] == versions["typescript_client"]
    api_major_minor = versions["api"].split(".")[:2]
    assert versions["python_client"].split(".")[:2] == api_major_minor
    import ledgerweb_client

    assert ledgerweb_client.__version__ == versions["python_client"]


def test_the_changelog_lists_every_release_newest_first() -> None:
    headings = re.findall(r"^## \[([^\]]+)\](?: - (\d{4}-\d{2}-\d{2}))?$", CHANGELOG, flags=re.M)
    assert headings[0] == ("Unreleased", ""), "the first section is [Unreleased]"
    released = [(version, date) for version, date in headings[1:]]
    assert released == [(r["version"], r["date"]) for r in RELEASES]
    for version, _ in released:
        assert SEMVER.match(version)
        assert re.search(rf"^\[{re.escape(version)}\]: ", CHANGELOG, flags=re.M), version
    kinds = set(re.findall(r"^### (.+)$", CHANGELOG, flags=re.M))
    assert kinds <= KINDS, kinds - KINDS
    # The code is at the newest release or ahead of it, never behind.
    newest = RELEASES[0]
    for name, version in current().items():
        as_tuple = tuple(int(n) for n in version.split("."))
        assert as_tuple >= tuple(int(n) for n in newest[name].split(".")), name


@pytest.mark.parametrize("release", RELEASES, ids=[r["version"] for r in RELEASES])
def test_each_release_names_its_commit_truthfully(release) -> None:
    assert re.fullmatch(r"[0-9a-f]{40}", release["commit"])
    assert release["tag"] == f"v{release['version']}"
    if git("cat-file", "-e", f"{release['commit']}^{{commit}}").returncode != 0:
        pytest.skip(
            f"release {release['version']}'s commit {release['commit'][:12]} is not in this "
            "clone (a shallow clone? git fetch --unshallow)"
        )

    def read(name: str) -> str:
        shown = git("show", f"{release['commit']}:{name}")
        assert shown.returncode == 0, shown.stderr
        return shown.stdout

    stated = {k: release[k] for k in ("version", "api", "python_client", "typescript_client")}
    assert versions_in(read) == stated
    tag = git("rev-parse", "--verify", "--quiet", f"refs/tags/{release['tag']}^{{commit}}")
    if tag.returncode == 0:  # tags need not travel to a fresh clone; when one did, it agrees
        assert tag.stdout.strip() == release["commit"]


MIGRATION_NAME = re.compile(r"\b(\d{4}_[a-z0-9_]*[a-z0-9])\b")
APPS = ("attempts", "reconciliation")


def migration_files(read_names) -> set[str]:
    """The migration names (``0013_byte_order_identifiers``) of both apps in one tree."""
    return {
        name.removesuffix(".py")
        for app in APPS
        for name in read_names(f"{app}/migrations")
        if MIGRATION_NAME.fullmatch(name.removesuffix(".py"))
    }


def released_migrations() -> dict[str, set[str]]:
    """Each release's migration files, for the releases whose commit is in this clone."""
    found = {}
    for release in RELEASES:
        listed = git("ls-tree", "--name-only", f"{release['commit']}:attempts/migrations")
        if listed.returncode != 0:
            continue
        found[release["version"]] = migration_files(
            lambda folder, commit=release["commit"]: git(
                "ls-tree", "--name-only", f"{commit}:{folder}"
            ).stdout.split()
        )
    return found


def test_the_changelog_names_only_migrations_that_exist_and_every_new_one() -> None:
    """A migration the changelog names is a file of the checkout or of a release; and every
    migration file added since the newest release is named in the [Unreleased] section, where an
    operator reads what ``migrate`` will do."""
    here = migration_files(lambda folder: [p.name for p in (REPO / folder).iterdir()])
    released = released_migrations()
    if not released:
        pytest.skip("no release's commit is in this clone (a shallow clone?)")
    known = here.union(*released.values())
    named = set(MIGRATION_NAME.findall(CHANGELOG))
    assert not named - known, (
        f"CHANGELOG.md names migrations that are not files: {sorted(named - known)}"
    )
    newest = RELEASES[0]["version"]
    if newest not in released:
        pytest.skip(f"release {newest}'s commit is not in this clone")
    unreleased = CHANGELOG.split("\n## [", 2)[1]
    assert unreleased.startswith("Unreleased]")
    missing = sorted(here - released[newest] - set(MIGRATION_NAME.findall(unreleased)))
    assert not missing, (
        f"new migrations since {newest} that CHANGELOG.md's [Unreleased] section does not name "
        f"(say what each does under Added/Changed and list it under Upgrade): {missing}"
    )
