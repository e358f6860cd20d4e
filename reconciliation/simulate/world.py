"""The world one simulated history runs in: tenants, tools on the simulated provider, grants,
people and their roles, an owner rule, an approval policy, an agent token issued by a person,
the log's signing key and a witness; and the clock the history moves forward."""

from __future__ import annotations

import contextlib
import datetime as dt
import secrets
from collections.abc import Iterator
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any
from unittest import mock

from django.contrib.auth import get_user_model
from django.test.utils import override_settings
from django.utils import timezone

from attempts import log
from attempts.actors import Actor
from attempts.config_history import acting
from attempts.models import (
    AgentToken,
    ApprovalPolicy,
    EffectClass,
    Grant,
    Membership,
    OwnershipRule,
    RetentionRule,
    Role,
    Tenant,
    Tool,
)
from reconciliation import bulkhead
from reconciliation.simulate.witness import Witness

ORIGIN = "simulation.example/ledger"
TENANTS = ("sim-a", "sim-b")
# name -> (effect class, critical)
TOOLS = {
    "sim_crm": (EffectClass.IDEMPOTENT, False),
    "sim_ticket": (EffectClass.RECONCILABLE, False),
    "sim_charge": (EffectClass.RECONCILABLE, True),
    "sim_deploy": (EffectClass.MANUAL, True),
}
HELD_TOOL = "sim_charge"
POLICY = "sim-big-charges"
# The agent token's name, and the person who issued it (a reviewer: issue 39, item 10).
AGENT = "sim-agent"
ISSUER = "sim-rev1"
PEOPLE = {
    "sim-admin1": Role.ADMIN,
    "sim-admin2": Role.ADMIN,
    "sim-rev1": Role.REVIEWER,
    "sim-rev2": Role.REVIEWER,
    "sim-rev3": Role.REVIEWER,
    "sim-op": Role.OPERATOR,
}
SETUP = Actor.system("simulation")
SIM_ADAPTER = "reconciliation.simulate.provider.SimAdapter"


def full_scopes(tool: str) -> list[str]:
    """The scopes every tenant is granted for ``tool`` (write first: an authority change that
    narrows a grant keeps only it)."""
    return [f"{tool}:write", f"{tool}:read"]


class SimClock:
    """Django's clock (``timezone.now``), moved forward by the history's steps, and the
    bulkheads' monotonic clock with it (their breakers and Retry-After follow the history,
    not the machine)."""

    def __init__(self) -> None:
        self.offset = dt.timedelta(0)
        self._real = timezone.now

    def now(self) -> dt.datetime:
        return self._real() + self.offset

    def monotonic(self) -> float:
        import time

        return time.monotonic() + self.offset.total_seconds()

    def advance(self, seconds: float) -> None:
        self.offset += dt.timedelta(seconds=seconds)

    @contextlib.contextmanager
    def installed(self) -> Iterator[None]:
        clock = self

        class _Time:
            @staticmethod
            def monotonic() -> float:
                return clock.monotonic()

        with (
            mock.patch.object(timezone, "now", self.now),
            mock.patch.object(bulkhead, "time", _Time),
        ):
            yield


@dataclass
class Keys:
    """The log's signing key file, its verifier, and verifier keys of rotated-out keys."""

    folder: Path
    current: Path
    verifier: Any
    old: list[Any] = field(default_factory=list)

    def rotate(self) -> None:
        self.old.append(self.verifier)
        self.current = self.folder / f"log-{secrets.token_hex(4)}.key"
        self.verifier = log.write_key_file(self.current, ORIGIN)

    def all(self) -> list[Any]:
        return [self.verifier, *self.old]


@dataclass
class Environment:
    """What lives for a whole run of histories: the folder, the witness server."""

    folder: Path
    witness: Witness
    witness_url: str

    def settings(self, keys: Keys, signer_state: Path) -> override_settings:
        from django.conf import settings

        return override_settings(
            ALLOWED_HOSTS=[*settings.ALLOWED_HOSTS, "testserver"],
            LEDGER={
                **settings.LEDGER,
                "ADAPTERS": {
                    **settings.LEDGER["ADAPTERS"],
                    "sim": SIM_ADAPTER,
                },
                "STALE_AFTER": 60,
                "UNKNOWN_MAX_AGE": 6 * 3600,
                "DEFAULT_OWNER": "",
            },
            TLOG={
                **settings.TLOG,
                "ORIGIN": ORIGIN,
                "KEY_FILE": str(keys.current),
                "SIGN_COMMAND": "",
                "VERIFIER_KEY": "",
                # One memory for the history's signer, whatever its key (as the default, the
                # data folder, keeps it), and none shared between histories.
                "SIGNER_STATE": str(signer_state),
                "OLD_VERIFIER_KEYS": [str(k) for k in keys.old],
                "WITNESSES": [f"{self.witness.verifier} {self.witness_url}"],
                "WITNESS_QUORUM": 1,
                "WITNESS_TIMEOUT": 2.0,
            },
        )


@dataclass
class People:
    by_name: dict[str, Any]

    def __getitem__(self, name: str) -> Any:
        return self.by_name[name]


def build(folder: Path) -> tuple[People, str]:
    """Create the world's rows (inside the history's transaction). Returns the people and the
    agent token's raw secret."""
    user_model = get_user_model()
    with acting(SETUP, "simulation world"):
        tenants = [Tenant.objects.create(slug=slug, name=slug.title()) for slug in TENANTS]
        tools = []
        for name, (effect_class, critical) in TOOLS.items():
            tool = Tool(
                name=name,
                effect_class=effect_class,
                critical=critical,
                adapter="sim",
                timeout_seconds=2.0,
                max_sends=3,
            )
            tool.save(force_insert=True)
            tools.append(tool)
        for tenant in tenants:
            for tool in tools:
                Grant.objects.create(
                    tenant=tenant,
                    tool=tool,
                    policy_version="v1",
                    allowed_scopes=full_scopes(tool.name),
                )
        people = {}
        for name, role in PEOPLE.items():
            people[name] = user_model.objects.create_user(name, f"{name}@example.test", None)
            for tenant in tenants:
                Membership.objects.create(user=people[name], tenant=tenant, role=role)
        OwnershipRule.objects.create(owner=people["sim-op"], tenant_pattern="*", priority=10)
        policy = ApprovalPolicy(
            name=POLICY,
            tool_id=HELD_TOOL,
            condition="args.amount > 100",
            approvals_needed=2,
            approval_ttl=dt.timedelta(hours=1),
            max_wait=dt.timedelta(hours=6),
        )
        policy.full_clean()
        policy.save()
        for tenant in TENANTS:
            for tool in ("sim_crm", "sim_ticket"):
                RetentionRule.objects.create(tenant_id=tenant, tool_id=tool, archive_after_days=1)
        _, raw = AgentToken.issue(AGENT, list(TENANTS), created_by=people[ISSUER])
    return People(people), raw
