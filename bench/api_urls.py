"""The product's URLs plus ``/bench/echo``: a minimal Django JSON view, the API bench's baseline.

It goes through the same middleware and gunicorn as the API and parses the same JSON body, but
touches no database: the cost of Django and HTTP alone. ``/bench/worker`` names the worker
process that serves a connection, so the bench can spread its clients' connections evenly.
"""

import json
import os

from django.contrib.auth.decorators import login_not_required
from django.http import JsonResponse
from django.urls import path
from django.views.decorators.csrf import csrf_exempt

from ledgerweb.urls import urlpatterns as product_urlpatterns


@csrf_exempt
@login_not_required
def echo(request):
    body = json.loads(request.body)
    return JsonResponse({"ok": True, "key": body.get("idempotency_key")}, status=201)


@login_not_required
def worker(request):
    return JsonResponse({"pid": os.getpid()})


urlpatterns = [path("bench/echo", echo), path("bench/worker", worker), *product_urlpatterns]
