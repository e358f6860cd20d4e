"""The overview screen (the dashboard's home)."""

from django.shortcuts import render

from attempts.models import Attempt


def overview(request):
    counts = {}
    for row in Attempt.objects.for_user(request.user).values_list("state"):
        counts[row[0]] = counts.get(row[0], 0) + 1
    return render(request, "attempts/overview.html", {"counts": counts})
