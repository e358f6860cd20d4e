"""Every cause the ledger or the reconciler writes into ``review_reason`` has a sentence an
operator can act on (attempts/reasons.py): pages never show a bare code alone."""

from __future__ import annotations

import re

from attempts.models import EffectClass
from attempts.reasons import EFFECT_CLASSES, REVIEW_REASONS, reason_text
from tests.conftest import REPO

WRITTEN = [
    re.compile(r"review_reason[\"']?\s*[:=]\s*[\"']([a-z_]+)[\"']"),
    re.compile(r"_to_review\(\s*\w+,\s*[\"']([a-z_]+)[\"']"),
    re.compile(r"return \(?\s*[\"']([a-z_]+)[\"'],\s*f?[\"']not sent"),
]


def test_every_review_reason_written_has_a_sentence():
    codes = set()
    for folder in ("attempts", "reconciliation"):
        for path in (REPO / folder).rglob("*.py"):
            text = path.read_text(encoding="utf-8")
            for pattern in WRITTEN:
                codes.update(pattern.findall(text))
    assert {"manual_class", "payload_mismatch", "approval_expired"} <= codes  # the scan works
    missing = sorted(codes - set(REVIEW_REASONS))
    assert not missing, f"review reasons without a sentence in attempts/reasons.py: {missing}"
    assert all(reason_text(code).endswith(".") for code in REVIEW_REASONS)
    assert reason_text("something_new") == "Something new."


def test_every_effect_class_has_a_sentence():
    assert set(EFFECT_CLASSES) == set(EffectClass.values)
