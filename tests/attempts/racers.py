"""Processes that race: the parent side of ``race_child`` and ``effect_race_child``."""

from __future__ import annotations

import json
import subprocess
import time
from collections.abc import Sequence

from tests.conftest import PYTHON, REPO, child_env

CHARGE = {"amount": 1200, "currency": "EUR", "card": "tok_4242"}


def race(module: str, argvs: Sequence[Sequence[str]], *, lead: float = 3.0) -> list[dict]:
    """``python -m module START_AT *argv`` for each of ``argvs``, all at once; every child waits
    for the same instant, ``lead`` seconds from now, so each is imported and connected before the
    gun. Returns each child's last output line as JSON, in order; a child that fails fails the
    test."""
    start_at = time.time() + lead
    children = [
        subprocess.Popen(
            [PYTHON, "-m", module, str(start_at), *argv],
            cwd=REPO,
            env=child_env(),
            stdout=subprocess.PIPE,
            stderr=subprocess.PIPE,
            text=True,
        )
        for argv in argvs
    ]
    results = []
    for child in children:
        out, err = child.communicate(timeout=120)
        assert child.returncode == 0, err
        results.append(json.loads(out.strip().splitlines()[-1]))
    return results
