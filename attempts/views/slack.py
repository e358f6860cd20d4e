"""The endpoint Slack sends button clicks to (``attempts.slack.interaction`` decides): no login
and no CSRF token, since Slack's signature is the proof instead; an unsigned, stale or replayed
request is refused there."""

from __future__ import annotations

from django.contrib.auth.decorators import login_not_required
from django.http import HttpRequest, JsonResponse
from django.views.decorators.csrf import csrf_exempt
from django.views.decorators.http import require_POST

from attempts import slack


@csrf_exempt
@login_not_required
@require_POST
def interactions(request: HttpRequest) -> JsonResponse:
    answer = slack.interaction(request.body, request.headers)
    return JsonResponse({"text": answer.text, "decided": answer.decided}, status=answer.status)
