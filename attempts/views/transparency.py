"""``/log/``: the transparency log, read-only, in the C2SP ``tlog-tiles`` layout.

``/log/checkpoint`` is the newest signed checkpoint (with its cosignatures); ``/log/tile/<L>/<N>``
and ``/log/tile/<L>/<N>.p/<W>`` are hash tiles of the tree that checkpoint covers. Never entry
contents: the leaves name attempts of every tenant (``/log/tile/entries/...`` is 404). Public and
cacheable, unless ``LEDGERWEB_TLOG_READ_TOKEN`` asks for a bearer token. Also, as a ledgerweb
extension for clients without tile support, ``/log/consistency/<old>/<new>``: the consistency
proof between two sizes, one base64 hash a line.
"""

from __future__ import annotations

import base64
import hmac

from django.conf import settings
from django.contrib.auth.decorators import login_not_required
from django.db import DatabaseError
from django.http import HttpRequest, HttpResponse
from django.views.decorators.http import require_GET

from attempts import log

IMMUTABLE = "public, max-age=31536000, immutable"


def _text(body: str, status: int = 200, cache: str = "no-store") -> HttpResponse:
    response = HttpResponse(body, status=status, content_type="text/plain; charset=utf-8")
    response["Cache-Control"] = cache
    return response


def _refused(request: HttpRequest) -> HttpResponse | None:
    token = settings.TLOG["READ_TOKEN"]
    if not token:
        return None
    given = request.headers.get("Authorization", "").removeprefix("Bearer ").strip()
    if hmac.compare_digest(given.encode(), token.encode()):
        return None
    response = _text("this log needs a bearer token (LEDGERWEB_TLOG_READ_TOKEN)\n", 401)
    response["WWW-Authenticate"] = 'Bearer realm="log"'
    return response


def _cache(value: str) -> str:
    # Behind a token, shared caches must not keep what they would then serve to anyone.
    return value.replace("public", "private") if settings.TLOG["READ_TOKEN"] else value


@login_not_required
@require_GET
def checkpoint(request: HttpRequest) -> HttpResponse:
    """The newest signed checkpoint note, cosignatures included."""
    if (refused := _refused(request)) is not None:
        return refused
    newest = log.newest_signed()
    if newest is None:
        return _text("no signed checkpoint yet: is a signing key configured?\n", 404)
    return _text(log.signed_note(newest) or "", cache=_cache("public, max-age=5, no-cache"))


@login_not_required
@require_GET
def tile(request: HttpRequest, path: str) -> HttpResponse:
    """A hash tile of the published tree."""
    if (refused := _refused(request)) is not None:
        return refused
    if path.startswith("entries/"):
        return _text("entry tiles are not served: leaves name every tenant's attempts\n", 404)
    try:
        wanted = log.TilePath.parse(path)
    except ValueError as exc:
        return _text(f"bad tile path: {exc}\n", 400)
    newest = log.newest_signed()
    try:
        data = log.tile(wanted, newest.size if newest else 0)
    except (LookupError, DatabaseError):
        data = None
    if data is None:
        return _text("no such tile in the published tree\n", 404)
    response = HttpResponse(data, content_type="application/octet-stream")
    response["Cache-Control"] = _cache(
        IMMUTABLE if wanted.width is None else "public, max-age=3600"
    )
    return response


@login_not_required
@require_GET
def consistency(request: HttpRequest, old: int, new: int) -> HttpResponse:
    """The consistency proof from tree size ``old`` to ``new`` (both within the published tree)."""
    if (refused := _refused(request)) is not None:
        return refused
    newest = log.newest_signed()
    if newest is None or not 0 <= old <= new <= newest.size:
        size = newest.size if newest else 0
        return _text(f"sizes must satisfy 0 <= old <= new <= {size} (the published tree)\n", 400)
    proof = log.consistency_proof(old, new)
    body = "".join(base64.b64encode(h).decode() + "\n" for h in proof)
    return _text(body, cache=_cache(IMMUTABLE))
