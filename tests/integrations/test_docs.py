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
from pathlib import Path

import pytest

from attempts import chain, log
from attempts.models import AgentToken, ApprovalPolicy, Attempt, State
from attempts.states import Actor
from reconciliation import config
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


def run_approving(
    script: Path, cwd: Path, env: dict[str, str], reviewer, *, holds: bool
) -> subprocess.CompletedProcess:
    """Run an approval example; approve every call it holds while it runs. ``holds``: whether
    it must hold something (a first run), or must not (a run the ledger answers from its
    record)."""
    process = subprocess.Popen(
        [sys.executable, str(script)],
        cwd=cwd,
        env=env,
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
    )
    deadline = time.monotonic() + 120
    approved: set[str] = set()
    while process.poll() is None and time.monotonic() < deadline:
        for attempt_id in Attempt.objects.filter(state=State.AWAITING_APPROVAL).values_list(
            "attempt_id", flat=True
        ):
            if attempt_id not in approved:
                approved.add(attempt_id)
                time.sleep(0.5)  # the example sees it held first
                approve(attempt_id, reviewer)
        time.sleep(0.2)
    stdout, stderr = process.communicate(timeout=10)
    if holds:
        assert approved, "the example held nothing"
    else:
        assert not approved, f"a second run was held again: {approved}"
    return subprocess.CompletedProcess(process.args, process.returncode, stdout, stderr)


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


# Every other page: the Python blocks of README.md and docs/*.md run as written, twice, against
# a live ledger configured with deploy/ledger.toml (as the README says), an agent token for acme
# and the log's signing key. A block is run unless it is marked:
#   ```python file=NAME      written to NAME beside the page's other examples (what they import)
#   ```python runs=NAME      run by another test, which finds it by ``runs=NAME``
#   ```python fragment       a part of a program, shown for its shape
# A block that imports the server (attempts, reconciliation) runs in ``manage.py shell``, with
# the ledger's settings, as the README's in-process example says; the others are agent scripts.
PAGES = [REPO / "README.md", *sorted((REPO / "docs").glob("*.md"))]
MARKS = {"file", "runs", "fragment"}
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


def runnable(page: Path) -> list[tuple[int, dict[str, str], str]]:
    """The page's Python blocks this test runs or writes, in order."""
    return [
        (line, marks, code)
        for line, language, marks, code in page_blocks(page)
        if language == "python" and "runs" not in marks and "fragment" not in marks
    ]


def test_every_python_block_of_the_docs_is_run_or_marked() -> None:
    tests = "\n".join(path.read_text() for path in (REPO / "tests").rglob("*.py"))
    run = 0
    for page in PAGES:
        if page == DOC:
            continue  # every block of docs/integrations.md runs in the tests above
        for line, language, marks, _code in page_blocks(page):
            where = f"{page.relative_to(REPO)}:{line}"
            if language != "python":
                continue
            assert set(marks) <= MARKS, f"{where}: unknown marks {set(marks) - MARKS}"
            if "runs" in marks:
                assert f"runs={marks['runs']}" in tests, f"{where}: no test runs {marks['runs']}"
            run += "runs" not in marks and "fragment" not in marks and "file" not in marks
    assert run >= 6  # the README's two, client.md's three, providers.md's adapter


def run_pages(root: Path, env: dict[str, str], *, first: bool) -> dict[str, str]:
    """Run the Python examples of every page but integrations.md, page by page in the guide's
    order, each page's in a folder of its own; while each runs, the sealer signs what it
    wrote, as the reconcile worker does. Each example's output, by ``page:line``."""
    outputs = {}
    for page in PAGES:
        if page == DOC or not runnable(page):
            continue
        folder = root / page.stem
        folder.mkdir(exist_ok=True)
        for line, marks, code in runnable(page):
            if "file" in marks:
                (folder / marks["file"]).write_text(code, encoding="utf-8")
                continue
            script = folder / f"example_{line}.py"
            script.write_text(code, encoding="utf-8")
            if IN_PROCESS.search(code):
                command = [sys.executable, "manage.py", "shell", "-v", "0", "-c"]
                command.append(f"exec(open({str(script)!r}).read())")
            else:
                command = [sys.executable, str(script)]
            process = subprocess.Popen(
                command,
                cwd=REPO if IN_PROCESS.search(code) else folder,
                env=env,
                stdout=subprocess.PIPE,
                stderr=subprocess.PIPE,
                text=True,
            )
            deadline = time.monotonic() + 120
            while process.poll() is None and time.monotonic() < deadline:
                while chain.seal() is not None:
                    pass
                time.sleep(0.2)
            stdout, stderr = process.communicate(timeout=10)
            where = f"{page.relative_to(REPO)}:{line}"
            run = "first" if first else "second"
            assert process.returncode == 0, f"{where}, {run} run:\n{stdout}\n{stderr}"
            outputs[where] = stdout
    return outputs


def test_the_python_examples_of_the_readme_and_docs_run_twice(
    live_server, settings, tmp_path
) -> None:
    config.apply(config.read(str(REPO / "deploy" / "ledger.toml")), actor=Actor.system("test"))
    _, token = AgentToken.issue("billing-agent", ["acme"])
    verifier = log.write_key_file(tmp_path / "log.key", LOG_ORIGIN)
    settings.TLOG = {**settings.TLOG, "KEY_FILE": str(tmp_path / "log.key"), "ORIGIN": LOG_ORIGIN}
    env = child_env(
        LEDGERWEB_URL=live_server.url,
        LEDGERWEB_TOKEN=token,
        LEDGERWEB_VERIFIER_KEY=str(verifier),
    )
    examples = tmp_path / "examples"
    examples.mkdir()
    first = run_pages(examples, env, first=True)
    readme_in_process, readme_client = (v for k, v in first.items() if k.startswith("README"))
    assert "OUTCOME_CONFIRMED True" in readme_in_process
    assert "OUTCOME_CONFIRMED" in readme_client
    client = [v for k, v in first.items() if k.startswith("docs/client.md")]
    assert "OUTCOME_CONFIRMED" in client[0] and "not sent here" not in client[0]
    assert "sent here: True" in client[1]
    assert "in the signed log of" in client[2]
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
