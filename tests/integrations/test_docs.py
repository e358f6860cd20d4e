"""The docs run as written: every Python block of README.md and docs/ that is meant to run runs
here, twice (or in the test its ``runs=NAME`` mark names).

docs/integrations.md: every ```python block without a file name is run as a script (in order, in one folder) against a live ledger; blocks named ``file=NAME`` are written
there first (the MCP example's upstream server and the gateway's configuration). The approval
examples (```python approver) run with the page's approval policies, and while each runs a
reviewer approves what it holds, through the ledger's own review function, as a person on the
dashboard would."""

from __future__ import annotations

import os
import re
import subprocess
import sys
import time
import tomllib
from collections.abc import Callable
from pathlib import Path

import pytest

from attempts import chain, log
from attempts.models import AgentToken, ApprovalPolicy, Attempt, State
from tests.conftest import REPO, World, child_env
from tests.integrations.approvals import approve
from tests.integrations.conftest import Tokens, sqlite_only

pytestmark = [pytest.mark.django_db(transaction=True), sqlite_only]

DOC = REPO / "docs" / "integrations.md"
BLOCK = re.compile(r"^```(\w+)([^\n]*)\n(.*?)^```$", re.MULTILINE | re.DOTALL)


def blocks() -> list[tuple[str, str | None, str]]:
    """(language, file name or None, code) of every fenced block, in order; an approval
    example's language is ``python approver``."""
    found = []
    for language, info, code in BLOCK.findall(DOC.read_text(encoding="utf-8")):
        name = re.search(r"file=(\S+)", info)
        if "approver" in info.split():
            language += " approver"
        found.append((language, name.group(1) if name else None, code))
    return found


def page_policies() -> None:
    """The page's ``[[approval_policies]]`` block, as the configuration would create them."""
    [config] = [code for language, name, code in blocks() if "approval_policies" in code]
    for policy in tomllib.loads(config)["approval_policies"]:
        ApprovalPolicy.objects.create(
            name=policy["name"], tool_id=policy["tool"], condition=policy["condition"]
        )


def run_beside(
    command: list[str], cwd: Path, env: dict[str, str], beside: Callable[[], None]
) -> subprocess.CompletedProcess:
    """Run ``command`` (two minutes at the most), calling ``beside`` every 0.2 s while it runs:
    what the ledger's side does meanwhile."""
    process = subprocess.Popen(
        command,
        cwd=cwd,
        env=env,
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
    )
    deadline = time.monotonic() + 120
    while process.poll() is None and time.monotonic() < deadline:
        beside()
        time.sleep(0.2)
    stdout, stderr = process.communicate(timeout=10)
    return subprocess.CompletedProcess(process.args, process.returncode, stdout, stderr)


def seal_everything() -> None:
    """Seal every event recorded so far, as the worker would."""
    while chain.seal() is not None:
        pass


def run_approving(
    script: Path, cwd: Path, env: dict[str, str], reviewer, *, holds: bool
) -> subprocess.CompletedProcess:
    """Run an approval example; approve every call it holds while it runs. ``holds``: whether
    it must hold something (a first run), or must not (a run the ledger answers from its
    record)."""
    approved: set[str] = set()

    def approve_held() -> None:
        for attempt_id in Attempt.objects.filter(state=State.AWAITING_APPROVAL).values_list(
            "attempt_id", flat=True
        ):
            if attempt_id not in approved:
                approved.add(attempt_id)
                time.sleep(0.5)  # the example sees it held first
                approve(attempt_id, reviewer)

    done = run_beside([sys.executable, str(script)], cwd, env, approve_held)
    if holds:
        assert approved, "the example held nothing"
    else:
        assert not approved, f"a second run was held again: {approved}"
    return done


def run_page(folder: Path, env: dict[str, str], reviewer, *, first: bool) -> list[str]:
    """Run every example of the page in order in ``folder``; each one's output."""
    outputs = []
    for index, (language, name, code) in enumerate(blocks()):
        if name is not None:
            (folder / name).write_text(code, encoding="utf-8")
        elif language.startswith("python"):
            script = folder / f"example_{index}.py"
            script.write_text(code, encoding="utf-8")
            if language.endswith("approver"):
                done = run_approving(script, folder, env, reviewer, holds=first)
            else:
                done = subprocess.run(
                    [sys.executable, str(script)],
                    cwd=folder,
                    env=env,
                    capture_output=True,
                    text=True,
                    timeout=120,
                )
            run = "first" if first else "second"
            assert done.returncode == 0, (
                f"example {index}, {run} run:\n{done.stdout}\n{done.stderr}"
            )
            outputs.append(done.stdout)
    return outputs


def test_the_page_has_an_example_for_each_integration() -> None:
    code = "\n".join(code for language, name, code in blocks() if language.startswith("python"))
    for needle in (
        "@ledgered(",
        "ledgered_tool(",
        "ToolNode(",
        "ledgered_function_tool(",
        "ledgerweb_client.mcp_gateway",
        "find_ticket",
        "Command(resume=",
        "apply_ledger_decisions(",
        "pending_approval",
        "ledger_decisions(",
        "ledger_approvals(",
    ):
        assert needle in code, needle


def test_every_example_runs_twice_against_one_ledger(
    live_server, tokens: Tokens, world: World, tmp_path
) -> None:
    page_policies()
    env = {
        **os.environ,
        "LEDGERWEB_URL": live_server.url,
        "LEDGERWEB_TOKEN": tokens.acme,
        "PYTHONPATH": str(REPO),
        # "python" in the gateway's configuration is this interpreter.
        "PATH": f"{Path(sys.executable).parent}{os.pathsep}{os.environ.get('PATH', '')}",
    }
    outputs = run_page(tmp_path, env, world.reviewer, first=True)
    assert "refused: idempotency_conflict" in outputs[0]
    assert "sent by this run: ['INV-7']" in outputs[0]
    assert "acme-co is now won" in outputs[2]
    assert "'replayed': True" in outputs[3]
    # The approval examples: held, approved by a person, then sent once.
    assert "held for approval:" in outputs[4] and "success" in outputs[4]
    assert "T-2001" in outputs[4]
    assert "held for approval: ['update_crm']" in outputs[5]
    assert "Closed acme-co." in outputs[5]
    assert "pending approval:" in outputs[6] and "False {'id': 'T-2'}" in outputs[6]
    assert "held for approval: ['update_crm']" in outputs[7]
    assert "Done: globex-co is now closed" in outputs[7]
    assert "held for approval: ['update_crm']" in outputs[8]
    assert "Done: initech-co is now closed" in outputs[8]
    assert set(Attempt.objects.values_list("state", flat=True)) == {State.OUTCOME_CONFIRMED}
    assert sorted(Attempt.objects.values_list("tool_name", flat=True)) == [
        "open_ticket",  # LangGraph's
        "open_ticket",  # LangGraph's, held for approval
        "open_ticket",  # the MCP gateway's
        "open_ticket",  # the MCP gateway's, held for approval
        "send_invoice_email",
        "update_crm",
        "update_crm",  # the Agents SDK's, held for approval
        "update_crm",  # Pydantic AI's, held for approval
        "update_crm",  # the Agent Framework's, held for approval
    ]
    held = Attempt.objects.exclude(approval_policy=None)
    assert held.count() == 5 and set(held.values_list("send_count", flat=True)) == {1}
    # The MCP example's upstream acted once for its two calls, and once for the held one.
    assert (tmp_path / "tickets.json").read_text().count('"id"') == 2
    # Run again as written, against the same ledger and the same ticket system: an agent that
    # runs its task again. The ledger answers every call from its record: nothing is held or
    # sent again, and nothing new is recorded.
    before = sorted(Attempt.objects.values_list("attempt_id", "state", "send_count", "version"))
    again = run_page(tmp_path, env, world.reviewer, first=False)
    assert "refused: idempotency_conflict" in again[0] and "sent by this run: []" in again[0]
    assert "acme-co is now won" in again[2]
    assert again[3].count("'replayed': True") == 2
    assert "success" in again[4] and "held for approval" not in again[4]
    assert "Closed acme-co." in again[5] and "held for approval" not in again[5]
    assert "pending approval:" not in again[6] and "False {'id': 'T-2'}" in again[6]
    assert "Done: globex-co is now closed" in again[7] and "held for approval" not in again[7]
    assert "Done: initech-co is now closed" in again[8] and "held for approval" not in again[8]
    after = sorted(Attempt.objects.values_list("attempt_id", "state", "send_count", "version"))
    assert after == before
    assert (tmp_path / "tickets.json").read_text().count('"id"') == 2


# Every other page: the examples of README.md and docs/*.md (but integrations.md's Python, run
# above, and deploy.md, which tests/test_deploy_guide.py walks) run as written against a live
# ledger with the log's signing key and an agent token for acme, in the page's order, README
# first: its shell block applies deploy/ledger.toml, as it tells the reader to. Python blocks
# run twice (the second time the ledger answers every call from its record); shell blocks run
# once, in the first pass (they create tokens and users, and a second create is refused by
# design), in a view of the checkout (its files linked into a scratch folder, where what a
# command writes lands), ``manage.py`` and ``ledgerweb`` on the PATH. A block is run unless
# its info string marks it:
#   file=NAME     (Python) written to NAME beside the page's other examples, which import it
#   runs=NAME     run by another test, which finds it by ``runs=NAME``
#   fragment      a part of a program, or a command's forms with placeholders, shown for its shape
#   server        starts or needs a long-running server (scripts/run, the demo, curl to :8000)
#   network       installs packages or needs a remote service (an index, a bucket)
#   slow          a benchmark: minutes each (tests/test_benches.py runs short versions)
#   root, containers  (deploy.md) needs root or systemd; a container engine
#   approver      (integrations.md) run above, while a reviewer approves what it holds
# A Python block that imports the server (attempts, reconciliation) runs in ``manage.py
# shell``, with the ledger's settings, as the README's in-process example says; the others are
# agent scripts, with the agent's URL and token in LEDGERWEB_URL and LEDGERWEB_TOKEN.
PAGES = [REPO / "README.md", *sorted((REPO / "docs").glob("*.md"))]
WALKED = REPO / "docs" / "deploy.md"  # tests/test_deploy_guide.py
MARKS = {"file", "runs", "fragment", "server", "network", "slow", "root", "containers", "approver"}
LOG_ORIGIN = "ledger.example.com/log"
IN_PROCESS = re.compile(r"^(from|import) (attempts|reconciliation)\b", re.MULTILINE)


def page_blocks(page: Path) -> list[tuple[int, str, dict[str, str], str]]:
    """(line, language, marks, code) of every fenced block of ``page``; the marks are the info
    string's words after the language, ``name=value`` or a bare ``name``."""
    text = page.read_text(encoding="utf-8")
    found = []
    for match in BLOCK.finditer(text):
        marks = dict((word.split("=", 1) + [""])[:2] for word in match.group(2).split())
        line = text[: match.start()].count("\n") + 1
        found.append((line, match.group(1), marks, match.group(3)))
    return found


def runnable(page: Path) -> list[tuple[int, str, dict[str, str], str]]:
    """The page's blocks this test runs or writes, (line, language, marks, code), in order."""
    if page == WALKED:
        return []
    return [
        (line, language, marks, code)
        for line, language, marks, code in page_blocks(page)
        if (language == "python" and page != DOC) or language == "sh"
        if not set(marks) & (MARKS - {"file"})
    ]


def test_every_example_of_the_docs_is_run_or_marked() -> None:
    tests = "\n".join(path.read_text() for path in (REPO / "tests").rglob("*.py"))
    run = {"python": 0, "sh": 0}
    for page in PAGES:
        for line, language, marks, _code in page_blocks(page):
            where = f"{page.relative_to(REPO)}:{line}"
            # Data, output and TypeScript blocks are not this test's; a shell or Python block
            # under another name (bash, console, py) would slip past it.
            assert language in ("python", "sh", "json", "toml", "yaml", "ts", ""), where
            if language not in ("python", "sh"):
                continue
            assert set(marks) <= MARKS, f"{where}: unknown marks {set(marks) - MARKS}"
            if "runs" in marks:
                assert f"runs={marks['runs']}" in tests, f"{where}: no test runs {marks['runs']}"
    for page in PAGES:
        for _line, language, marks, _code in runnable(page):
            run[language] += "file" not in marks
    # README's two and client.md's three Python examples, providers.md's adapter; the README's
    # configuration, the token and password-link commands of api.md, client.md and config.md.
    assert run["python"] >= 6 and run["sh"] >= 4, run


def run_pages(root: Path, env: dict[str, str], *, first: bool) -> dict[str, str]:
    """Run the examples of every page, page by page, the Python ones of each page in a folder
    of its own; while each runs, the sealer signs what it wrote, as the reconcile worker does.
    The agent's token is issued before the first Python example, once the README's shell block
    has made the tenant. Each example's output, by ``page:line``."""
    checkout = root / "checkout"
    if not checkout.exists():
        checkout.mkdir()
        for entry in REPO.iterdir():
            if entry.name not in (".git", "var"):
                (checkout / entry.name).symlink_to(entry)
    shell_env = {**env, "PATH": f"{checkout}:{Path(sys.executable).parent}:/usr/bin:/bin"}
    outputs = {}
    for page in PAGES:
        folder = root / page.stem
        for line, language, marks, code in runnable(page):
            folder.mkdir(exist_ok=True)
            if "file" in marks:
                (folder / marks["file"]).write_text(code, encoding="utf-8")
                continue
            if language == "sh":
                if not first:
                    continue
                command, cwd, run_env = ["bash", "-eo", "pipefail", "-c", code], checkout, shell_env
            else:
                if "LEDGERWEB_TOKEN" not in env:
                    env["LEDGERWEB_TOKEN"] = AgentToken.issue("docs-agent", ["acme"])[1]
                script = folder / f"example_{line}.py"
                script.write_text(code, encoding="utf-8")
                command, cwd, run_env = [sys.executable, str(script)], folder, env
                if IN_PROCESS.search(code):
                    command = [sys.executable, "manage.py", "shell", "-v", "0", "-c"]
                    command.append(f"exec(open({str(script)!r}).read())")
                    cwd = REPO
            done = run_beside(command, cwd, run_env, seal_everything)
            where = f"{page.relative_to(REPO)}:{line}"
            run = "first" if first else "second"
            assert done.returncode == 0, f"{where}, {run} run:\n{done.stdout}\n{done.stderr}"
            outputs[where] = done.stdout
    return outputs


def test_the_examples_of_the_readme_and_docs_run_twice(live_server, settings, tmp_path) -> None:
    verifier = log.write_key_file(tmp_path / "log.key", LOG_ORIGIN)
    settings.TLOG = {**settings.TLOG, "KEY_FILE": str(tmp_path / "log.key"), "ORIGIN": LOG_ORIGIN}
    env = child_env(
        LEDGERWEB_URL=live_server.url,
        LEDGERWEB_VERIFIER_KEY=str(verifier),
    )
    examples = tmp_path / "examples"
    examples.mkdir()
    first = run_pages(examples, env, first=True)
    readme = [v for k, v in first.items() if k.startswith("README")]
    assert "5 created" in readme[0]  # deploy/ledger.toml, applied as the README says
    assert "OUTCOME_CONFIRMED True" in readme[1]
    assert "OUTCOME_CONFIRMED" in readme[2]
    assert "http://" in readme[3]  # rita's one-time link, after the dump of what was applied
    assert 'username = "rita"' in (examples / "checkout" / "ledger.toml").read_text()
    client = [v for k, v in first.items() if k.startswith("docs/client.md")]
    assert "OUTCOME_CONFIRMED" in client[1] and "not sent here" not in client[1]
    assert "sent here: True" in client[2]
    assert "in the signed log of" in client[3]
    before = sorted(Attempt.objects.values_list("attempt_id", "state", "send_count", "version"))
    assert {state for _, state, _, _ in before} == {State.OUTCOME_CONFIRMED}
    # Again, as written: every call is answered from the ledger's record; nothing is sent twice.
    again = run_pages(examples, env, first=False)
    assert "OUTCOME_CONFIRMED False" in next(v for k, v in again.items() if k.startswith("README"))
    client = [v for k, v in again.items() if k.startswith("docs/client.md")]
    assert "not sent here: OUTCOME_CONFIRMED" in client[0] and "sent here: False" in client[1]
    assert "in the signed log of" in client[2]
    after = sorted(Attempt.objects.values_list("attempt_id", "state", "send_count", "version"))
    assert after == before
