"""Slack approvals (docs/integrations.md): a held call is posted to its route's Slack channel
with Approve / Reject / Open; a click is believed only when Slack's signature verifies, is
fresh and was not seen before, is mapped to a ledger user by a verified identity, and decides by
exactly the dashboard's rules (``review.approve_held`` / ``reject_held``); the message then says
what was decided and by whom. Against a real HTTP server on 127.0.0.1 that speaks Slack's Web
API methods, and clicks signed as Slack signs them."""

from __future__ import annotations

import contextlib
import datetime as dt
import json
import threading
import time
import urllib.request

import pytest
from django.test import Client
from django.utils import timezone

from attempts import ledger, notify, slack
from attempts.actors import Actor
from attempts.config_history import acting
from attempts.models import (
    Approval,
    ApprovalPolicy,
    Attempt,
    NotificationRoute,
    SlackIdentity,
    SlackMessage,
    SsoIdentity,
    State,
)
from tests.dashboard.approvals_helpers import held_intent, hold_big_charges
from tests.slack_server import FakeSlack, click_body, signed, slack_user

SECRET = "8f742231b10e8888abcd99yyyzzz85a5"
URL = "/slack/interactions"


@contextlib.contextmanager
def slack_for(settings, world):
    """A Slack stand-in, the deployment pointed at it, people with verified identities and a
    route posting approval notices to channel C0APPROVE."""
    users = {
        "U0REVIEW": slack_user("U0REVIEW", "Reviewer@Example.test"),
        "U0REVIEW2": slack_user("U0REVIEW2", "reviewer2@example.test"),
        "U0VIEWER": slack_user("U0VIEWER", "viewer@example.test"),
        "U0STRANGER": slack_user("U0STRANGER", "stranger@example.test"),
        # A confirmed email, but the ledger account with it signs in with a password only.
        "U0LOCAL": slack_user("U0LOCAL", "operator@example.test"),
    }
    with FakeSlack(users) as server:
        settings.SLACK = {
            "BOT_TOKEN": "xoxb-test",
            "SIGNING_SECRET": SECRET,
            "API_URL": server.url,
            "TIMEOUT": 5,
        }
        settings.NOTIFY = {**settings.NOTIFY, "BASE_URL": "https://ledger.example.test"}
        with acting(Actor.system("test-setup"), "Slack approvals"):
            for person in (world.reviewer, world.reviewer2, world.viewer):
                SsoIdentity.objects.create(user=person, subject=f"sub-{person.username}")
            SlackIdentity.objects.create(
                team_id="T0LEDGER", slack_user_id="U0ADMIN", user=world.admin
            )
            route = NotificationRoute.objects.create(
                name="approvers", kinds=["approval"], slack_channel="C0APPROVE"
            )
            route.people.set([world.reviewer])
        yield server


@pytest.fixture
def fake_slack(settings, world):
    with slack_for(settings, world) as server:
        yield server


@pytest.fixture
def posted(world, fake_slack):
    """A charge of 2,000.01 EUR held by big-charges (two approvers), posted to Slack."""
    hold_big_charges()
    notify.enqueue_from_events()
    attempt = held_intent(
        world,
        "charge:acme:slack",
        {"amount_cents": 200001, "currency": "eur", "card_number": "4242424242424242"},
    )
    notify.enqueue_from_events()
    assert slack.deliver_due() == {"posted": 1, "updated": 0, "failed": 0}
    return attempt


def button(attempt: Attempt) -> str:
    """The value of the message's Approve and Reject buttons, as Slack sends it back."""
    (message,) = SlackMessage.objects.filter(attempt=attempt)
    return json.dumps(
        {
            "attempt": attempt.attempt_id,
            "args_hash": attempt.args_hash,
            "policy_version": ApprovalPolicy.objects.get(pk=attempt.approval_policy_id).version,
        }
    )


def click(who: str, attempt: Attempt, action: str = slack.APPROVE, **sign) -> dict:
    body = click_body(who, action, button(attempt))
    response = Client().post(
        URL,
        data=body,
        content_type="application/x-www-form-urlencoded",
        headers=signed(body, sign.pop("secret", SECRET), **sign),
    )
    return {"status": response.status_code, **response.json()}


def shown(server: FakeSlack) -> str:
    """The text of the (one) message as Slack shows it now."""
    (message,) = server.messages.values()
    return json.dumps(message["blocks"], ensure_ascii=False)


def unchanged(attempt: Attempt):
    """What a refused click must leave as it was: the attempt's version and its approvals."""
    return Attempt.objects.get(pk=attempt.pk).version, Approval.objects.count()


def test_a_held_call_is_posted_to_its_routes_channel_with_its_values_and_buttons(
    posted, fake_slack
):
    (post,) = fake_slack.named("chat.postMessage")
    assert post["channel"] == "C0APPROVE"
    blocks = json.dumps(post["blocks"], ensure_ascii=False)
    assert "charge_card in acme waits for approval" in blocks
    assert "amount_cents = 200001" in blocks  # the condition's value, as it is
    assert "Amount:" not in blocks  # charge_card declares no amount here: none is guessed
    assert "Approvals: 0 of 2" in blocks
    assert "4242424242424242" not in blocks  # secret fields stay out of Slack
    actions = [b for b in post["blocks"] if b["type"] == "actions"][0]["elements"]
    assert [a["action_id"] for a in actions] == [slack.APPROVE, slack.REJECT, slack.OPEN]
    assert actions[2]["url"] == (
        f"https://ledger.example.test/approvals/{posted.attempt_id}/edit/"
    )  # edit-and-approve stays in the dashboard
    # Reading the same events again posts nothing more.
    notify.enqueue_from_events()
    slack.deliver_due()
    assert len(fake_slack.named("chat.postMessage")) == 1


def test_a_signed_click_approves_once_and_the_message_says_who(world, posted, fake_slack):
    answer = click("U0REVIEW", posted)
    assert answer == {"status": 200, "decided": True, "text": answer["text"]}
    assert "Approved by reviewer: 1 of 2" in answer["text"]
    assert list(Approval.objects.values_list("approver__username", flat=True)) == ["reviewer"]
    assert "Approvals: 1 of 2 (reviewer)" in shown(fake_slack)
    assert Attempt.objects.get(pk=posted.pk).state == State.AWAITING_APPROVAL

    answer = click("U0REVIEW2", posted)
    assert answer["decided"] and "released" in answer["text"]
    assert Attempt.objects.get(pk=posted.pk).state == State.INTENT_RECORDED
    text = shown(fake_slack)
    assert "Approved by reviewer, reviewer2" in text
    assert slack.APPROVE not in text  # nothing left to click but Open


def test_a_forged_a_stale_and_a_replayed_click_are_refused_and_change_nothing(posted, fake_slack):
    before = unchanged(posted)
    body = click_body("U0REVIEW", slack.APPROVE, button(posted))
    unsigned = Client().post(URL, body, "application/x-www-form-urlencoded")
    assert unsigned.status_code == 401 and "no Slack signature" in unsigned.json()["text"]
    forged = click("U0REVIEW", posted, secret="not-the-signing-secret")
    assert forged["status"] == 401 and "signature does not match" in forged["text"]
    stale = click("U0REVIEW", posted, timestamp=int(time.time()) - 6 * 60)
    assert stale["status"] == 401 and "more than five minutes" in stale["text"]
    assert unchanged(posted) == before

    body = click_body("U0REVIEW", slack.APPROVE, button(posted))
    headers = signed(body, SECRET)
    first = Client().post(URL, body, "application/x-www-form-urlencoded", headers=headers)
    assert first.status_code == 200 and first.json()["decided"]
    after_first = unchanged(posted)
    again = Client().post(URL, body, "application/x-www-form-urlencoded", headers=headers)
    assert again.status_code == 409 and "replay" in again.json()["text"]
    assert unchanged(posted) == after_first


def test_whoever_the_dashboard_would_refuse_is_refused_in_slack_with_a_message(
    world, posted, fake_slack
):
    before = unchanged(posted)
    stranger = click("U0STRANGER", posted)
    assert not stranger["decided"] and "no single ledger user" in stranger["text"]
    local = click("U0LOCAL", posted)  # an email nobody's identity provider vouches for
    assert not local["decided"] and "no single ledger user" in local["text"]
    viewer = click("U0VIEWER", posted)
    assert not viewer["decided"] and "needs the reviewer role" in viewer["text"]
    Attempt.objects.filter(pk=posted.pk).update(recorded_by="reviewer")
    recorder = click("U0REVIEW", posted)
    assert not recorder["decided"] and "whoever recorded an intent" in recorder["text"]
    assert unchanged(posted) == before
    # Each refusal is shown to the person who clicked, in the channel, for their eyes only.
    told = fake_slack.named("chat.postEphemeral")
    assert [t["user"] for t in told] == ["U0STRANGER", "U0LOCAL", "U0VIEWER", "U0REVIEW"]

    assert click("U0REVIEW2", posted)["decided"]
    after_first = unchanged(posted)
    twice = click("U0REVIEW2", posted)
    assert not twice["decided"] and "already approved" in twice["text"]
    assert unchanged(posted) == after_first


def test_an_administrator_linked_slack_user_decides_as_that_user(world, posted, fake_slack):
    answer = click("U0ADMIN", posted, slack.REJECT)
    assert answer["decided"] and answer["text"] == "Rejected by admin."
    current = Attempt.objects.get(pk=posted.pk)
    assert current.state == State.FAILED and current.review_reason == "approval_rejected"
    assert "Rejected by admin: rejected in Slack by admin" in shown(fake_slack)
    assert not fake_slack.named("users.info")  # the link is the identity: Slack is not asked


def test_a_click_on_a_message_for_an_older_policy_version_is_refused(world, posted, fake_slack):
    value = button(posted)
    policy = ApprovalPolicy.objects.get(name="big-charges")
    policy.approvals_needed = 3
    policy.save()
    body = click_body("U0REVIEW", slack.APPROVE, value)
    answer = (
        Client()
        .post(URL, body, "application/x-www-form-urlencoded", headers=signed(body, SECRET))
        .json()
    )
    assert not answer["decided"] and "changed (version 1 → 2)" in answer["text"]
    assert not Approval.objects.exists()


def test_an_expired_wait_is_shown_and_a_late_click_refused(world, posted, fake_slack):
    later = timezone.now() + dt.timedelta(hours=11)
    assert ledger.expire_waits(actor=Actor.worker("test"), now=later) == 1
    notify.enqueue_from_events(now=later)
    assert slack.deliver_due(now=later)["updated"] == 1
    assert "Not approved in time" in shown(fake_slack)
    late = click("U0REVIEW", posted)
    assert not late["decided"] and "FAILED, not waiting for approval" in late["text"]


def test_slack_being_down_never_blocks_a_decision_and_the_message_catches_up(
    world, posted, fake_slack
):
    fake_slack.down = True
    answer = click("U0ADMIN", posted)  # the linked admin: no users.info needed
    assert answer["decided"]
    assert Approval.objects.count() == 1
    (message,) = SlackMessage.objects.all()
    assert message.shown < message.wanted and message.tries == 1
    assert "service_unavailable" in message.last_error
    fake_slack.down = False
    assert slack.deliver_due(now=timezone.now() + dt.timedelta(minutes=5))["updated"] == 1
    assert "Approvals: 1 of 2 (admin)" in shown(fake_slack)


def test_without_slack_configured_the_endpoint_refuses(db, settings):
    settings.SLACK = {**settings.SLACK, "BOT_TOKEN": "", "SIGNING_SECRET": ""}
    body = click_body("U0REVIEW", slack.APPROVE, "{}")
    response = Client().post(URL, body, "application/x-www-form-urlencoded")
    assert response.status_code == 404


@pytest.mark.django_db(transaction=True)
def test_two_people_clicking_at_once_each_decide_once_and_four_eyes_hold(live_server, settings):
    from tests.conftest import make_world

    world = make_world()
    with slack_for(settings, world):
        hold_big_charges()
        notify.enqueue_from_events()
        attempt = held_intent(world, "charge:acme:both", {"amount_cents": 500000})
        notify.enqueue_from_events()
        slack.deliver_due()
        value = button(attempt)
        answers = {}
        start = threading.Barrier(2)

        def press(who: str) -> None:
            body = click_body(who, slack.APPROVE, value)
            request = urllib.request.Request(  # noqa: S310 (the test's own server)
                live_server.url + URL, data=body, headers=signed(body, SECRET), method="POST"
            )
            start.wait(timeout=10)
            with urllib.request.urlopen(request, timeout=30) as response:  # noqa: S310
                answers[who] = json.loads(response.read())

        threads = [threading.Thread(target=press, args=(w,)) for w in ("U0REVIEW", "U0REVIEW2")]
        for thread in threads:
            thread.start()
        for thread in threads:
            thread.join(timeout=60)
        assert all(answers[w]["decided"] for w in ("U0REVIEW", "U0REVIEW2")), answers
        current = Attempt.objects.get(pk=attempt.pk)
        assert current.state == State.INTENT_RECORDED
        assert sorted(Approval.objects.values_list("approver__username", flat=True)) == [
            "reviewer",
            "reviewer2",
        ]
        assert current.events.filter(action="attempt.approved").count() == 1


def test_the_pages_slack_route_applies_as_written_and_posts_to_its_channel(world, settings):
    """docs/integrations.md's route, applied through ``ledger_config`` as an operator would."""
    import re

    from reconciliation import config
    from reconciliation.config.document import read
    from tests.conftest import REPO

    page = (REPO / "docs" / "integrations.md").read_text(encoding="utf-8")
    [example] = [
        code
        for code in re.findall(r"^```toml[^\n]*\n(.*?)^```$", page, re.MULTILINE | re.DOTALL)
        if "slack_channel" in code
    ]
    config.apply(read("integrations.md", example), actor=Actor.system("test"))
    route = NotificationRoute.objects.get(name="payments-approvers")
    assert route.slack_channel == "C0APPROVE"
    hold_big_charges()
    assert slack.channels_for(held_intent(world, "charge:acme:doc", {"amount_cents": 150000})) == [
        "C0APPROVE"
    ]
    held = held_intent(world, "charge:globex:doc", {"amount_cents": 150000}, tenant="globex")
    assert slack.channels_for(held) == []  # the route is acme's
    assert "slack_channel" in config.dump()


def test_a_decision_on_the_dashboard_updates_the_slack_message_too(world, posted, fake_slack):
    """The message follows the attempt's history, whoever decided: the worker's notification
    step reads the approval event and updates it."""
    from attempts import review

    review.approve_held(posted, user=world.reviewer)
    notify.enqueue_from_events()
    assert slack.deliver_due()["updated"] == 1
    assert "Approvals: 1 of 2 (reviewer)" in shown(fake_slack)
    # The notifier has read everything before (its cursor moves once events are old enough).
    notify.enqueue_from_events(now=timezone.now() + dt.timedelta(minutes=1))
    slack.deliver_due(now=timezone.now() + dt.timedelta(minutes=1))
    review.reject_held(posted, user=world.reviewer2, reason="too large")
    later = timezone.now() + dt.timedelta(minutes=2)
    notify.enqueue_from_events(now=later)
    assert slack.deliver_due(now=later)["updated"] == 1
    assert "Rejected by reviewer2: too large" in shown(fake_slack)
    assert slack.APPROVE not in shown(fake_slack)


def test_every_call_to_slack_has_a_deadline_on_the_whole_answer(
    world, posted, fake_slack, settings
):
    """A Web API answer dripping a byte at a time (each read well within any per-read timeout)
    is cut at the deadline: the worker goes on, the message is retried later."""
    settings.SLACK = {**settings.SLACK, "TIMEOUT": 1}
    slack.touch(posted)
    fake_slack.drip = True
    started = time.monotonic()
    assert slack.deliver_due()["failed"] == 1
    assert time.monotonic() - started < 3
    (message,) = SlackMessage.objects.all()
    assert "did not answer within 1 seconds" in message.last_error
    fake_slack.drip = False
    assert slack.deliver_due(now=timezone.now() + dt.timedelta(minutes=5))["updated"] == 1


def test_the_message_shows_a_declared_amount_as_money(world, fake_slack):
    from attempts.models import Tool

    Tool.objects.filter(name="charge_card").update(
        amount_arg="amount_cents", currency_arg="currency"
    )
    hold_big_charges()
    attempt = held_intent(world, "charge:acme:money", {"amount_cents": 200001, "currency": "eur"})
    text, blocks = slack.render(attempt)
    assert "Amount: *€2,000.01* (amount_cents = 200001)" in json.dumps(blocks, ensure_ascii=False)
