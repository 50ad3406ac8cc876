"""The console's error pages that need a view of their own: a failed CSRF
check (``settings.CSRF_FAILURE_VIEW``).

Django's own CSRF page renders without the request (no header, no roles) and
speaks of ``DEBUG=True``. This one renders ``403_csrf.html`` in the console's
frame with a link back to the page the form was on (its ``Referer``, when it
is this site's), where a fresh GET hands out a fresh token.

The reason the user typed is kept in the browser, never by the server:
``static/console/console.js`` saves a form's ``reason`` in ``sessionStorage``
as the form is sent, this page (``data-csrf-failure``) marks that draft as
failed and shows it, and the form's page puts it back into the empty field.
The body of a request that failed its CSRF check may be a forgery, so the
server neither echoes it into a form nor logs it (Django's
``django.security.csrf`` warning names only the path and the check's reason).
"""

from __future__ import annotations

from django.http import HttpRequest, HttpResponse
from django.shortcuts import render
from django.urls import reverse
from django.utils.http import url_has_allowed_host_and_scheme

CSRF_TEMPLATE = "403_csrf.html"


def csrf_failure(request: HttpRequest, reason: str = "") -> HttpResponse:
    """403 in the console's frame; ``reason`` is Django's (cookie or token
    missing or wrong), shown in plain words, never the user's text."""
    referer = request.META.get("HTTP_REFERER", "")
    same_site = url_has_allowed_host_and_scheme(
        referer, allowed_hosts={request.get_host()}, require_https=request.is_secure()
    )
    context = {
        "back": referer if referer and same_site else reverse("console:overview"),
        "back_is_form": bool(referer and same_site),
        "no_cookie": "cookie" in reason.lower(),
    }
    return render(request, CSRF_TEMPLATE, context, status=403)
