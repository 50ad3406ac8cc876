"""Every answer carries the Content-Security-Policy, and every page complies
with it — issue 39, item 4.

The routes are Django's resolver enumerated (``tests/route_enumeration.py``),
so a new page is covered without editing this file: the console (pages and
their live partials), the admin of every registered model, the login pages,
the API in every format, its schema and docs pages, ``/metrics``. Each
answer, whatever its status (a page, a redirect to the login, a 404), holds
the policy's directives; no answer allows an inline script or ``eval``.

Each HTML answer is also read for what its policy would refuse: an inline
``<script>`` without the request's nonce, an event-handler attribute
(``onclick=``), a ``javascript:`` URL, and, where ``style-src`` has no
``'unsafe-inline'``, a ``style=`` attribute or a ``<style>`` element. The
browser test at the end opens pages and listens for the violations a real
browser reports.
"""

from __future__ import annotations

import re
from html.parser import HTMLParser
from urllib.parse import urlsplit

import pytest
from django.contrib.auth.models import User
from django.test import Client

from . import chromium, crawler_world
from .chromium import PASSWORD, needs_chromium
from .conftest import make_user
from .crawler_world import World
from .route_enumeration import formats, routes, variants

world = crawler_world.world  # the fixture: customers a and b (tests/crawler_world.py)

# Directive -> the source list every answer's policy must hold exactly.
REQUIRED = {
    "default-src": "'self'",
    "object-src": "'none'",
    "base-uri": "'self'",
    "form-action": "'self'",
    "frame-ancestors": "'none'",
}
NONEXECUTABLE_SCRIPT_TYPES = {"application/json", "application/ld+json", "text/template", "text/html"}

browser = chromium.browser


def directives(header: str) -> dict[str, list[str]]:
    parsed: dict[str, list[str]] = {}
    for part in header.split(";"):
        words = part.split()
        if words:
            parsed[words[0]] = words[1:]
    return parsed


def policy_problems(header: str | None) -> list[str]:
    if not header:
        return ["no Content-Security-Policy header"]
    policy = directives(header)
    problems = [
        f"{name} is {' '.join(policy.get(name, ['(missing)']))!r}, not {value!r}"
        for name, value in REQUIRED.items()
        if policy.get(name) != [value]
    ]
    script = policy.get("script-src", policy.get("default-src", []))
    problems += [f"script-src allows {bad}" for bad in ("'unsafe-inline'", "'unsafe-eval'", "*") if bad in script]
    return problems


class InlineFinder(HTMLParser):
    """What a page holds that its policy (``nonce``, inline styles allowed or not) refuses."""

    def __init__(self, *, nonce: str | None, inline_styles: bool) -> None:
        super().__init__()
        self.nonce, self.inline_styles = nonce, inline_styles
        self.problems: list[str] = []

    def handle_starttag(self, tag: str, attrs: list[tuple[str, str | None]]) -> None:
        values = dict(attrs)
        for name, value in attrs:
            if name.startswith("on"):
                self.problems.append(f"<{tag} {name}=…>: an inline event handler")
            if name in {"href", "src", "action", "formaction"} and (value or "").strip().lower().startswith(
                "javascript:"
            ):
                self.problems.append(f"<{tag} {name}={value!r}>: a javascript: URL")
            if name == "style" and not self.inline_styles:
                self.problems.append(f"<{tag} style={value!r}>: an inline style")
        if tag == "style" and not self.inline_styles:
            self.problems.append("<style>: an inline style element")
        if tag == "script" and "src" not in values:
            kind = (values.get("type") or "").strip().lower()
            if kind not in NONEXECUTABLE_SCRIPT_TYPES and (self.nonce is None or values.get("nonce") != self.nonce):
                self.problems.append(f"<script {values}>: an inline script without the request's nonce")


def page_problems(html: str, header: str) -> list[str]:
    policy = directives(header)
    nonces = [v[len("'nonce-") : -1] for v in policy.get("script-src", []) if v.startswith("'nonce-")]
    finder = InlineFinder(nonce=nonces[0] if nonces else None, inline_styles="'unsafe-inline'" in policy["style-src"])
    finder.feed(html)
    return finder.problems


def route_kind(pattern: str, name: str) -> str:
    if pattern.startswith("admin/"):
        return "admin"
    if name in {"api-docs", "api-redoc"}:
        return "api docs"
    if pattern.startswith("api/"):
        return "api"
    if name == "login":
        return "login"
    if name.startswith("console:"):
        return "console"
    return "other"


@pytest.mark.django_db
def test_every_route_answers_with_the_policy_and_every_page_complies_with_it(world: World) -> None:
    superuser = User.objects.get(pk=world.users["superuser"].pk)
    anonymous, staff = Client(raise_request_exception=False), Client(raise_request_exception=False)
    staff.force_login(superuser)
    problems: list[str] = []
    kinds: dict[str, int] = {}
    html_pages = 0
    for route in routes():
        for variant in variants(route, world, frozenset({"A1"})):
            for fmt, query, headers in formats(route, customer=True):
                for who, client in (("anonymous", anonymous), ("superuser", staff)):
                    url = variant.url + query
                    response = client.get(url, **headers)
                    where = f"GET {url} [{fmt}] as {who} ({response.status_code})"
                    header = response.get("Content-Security-Policy")
                    problems += [f"{where}: {p}" for p in policy_problems(header)]
                    kind = route_kind(route.pattern, route.name)
                    kinds[kind] = kinds.get(kind, 0) + 1
                    if header and response.get("Content-Type", "").startswith("text/html") and not response.streaming:
                        html_pages += 1
                        problems += [f"{where}: {p}" for p in page_problems(response.content.decode(), header)]
    assert not problems, "\n".join(problems[:100]) + f"\n({len(problems)} problems)"
    assert {"admin", "api", "api docs", "login", "console"} <= set(kinds), kinds
    assert html_pages > 100, html_pages


@pytest.mark.django_db
def test_the_docs_pages_widen_the_policy_for_themselves_only_and_never_for_inline_scripts() -> None:
    client = Client()
    client.force_login(make_user("docs-reader", "auditor"))
    swagger = client.get("/api/v1/docs/")
    assert "<script>" not in swagger.content.decode()  # the split view: the start-up script is a request of its own
    script = client.get("/api/v1/docs/?script=")
    assert script["Content-Type"].startswith("application/javascript")
    assert "SwaggerUIBundle" in script.content.decode()
    redoc = client.get("/api/v1/redoc/")
    policy = directives(redoc["Content-Security-Policy"])
    nonce = next(v for v in policy["script-src"] if v.startswith("'nonce-"))
    assert f'<script nonce="{nonce[7:-1]}">' in redoc.content.decode()
    assert "'unsafe-inline'" in policy["style-src"] and "'unsafe-inline'" not in policy["script-src"]
    # Two requests, two nonces.
    again = directives(client.get("/api/v1/redoc/")["Content-Security-Policy"])
    assert next(v for v in again["script-src"] if v.startswith("'nonce-")) != nonce
    console = directives(client.get("/console/")["Content-Security-Policy"])
    assert console["style-src"] == ["'self'"] and console["script-src"] == ["'self'"]


def test_the_page_reader_finds_what_the_policy_refuses() -> None:
    strict = "default-src 'self'; script-src 'self' 'nonce-abc'; style-src 'self'"
    assert page_problems('<script nonce="abc">go()</script><script src="/s.js"></script>', strict) == []
    assert page_problems('<script type="application/json">{"a": 1}</script>', strict) == []
    assert len(page_problems("<script>go()</script>", strict)) == 1
    assert len(page_problems('<script nonce="other">go()</script>', strict)) == 1
    assert len(page_problems('<button onclick="go()">x</button>', strict)) == 1
    assert len(page_problems('<a href="javascript:go()">x</a>', strict)) == 1
    assert len(page_problems('<span style="width: 5%"></span><style>b{}</style>', strict)) == 2
    assert page_problems('<span style="width: 5%"></span>', strict + " 'unsafe-inline'") == []
    assert policy_problems("default-src 'self'; script-src 'self' 'unsafe-inline'")  # and the REQUIRED ones missing


# --- In a browser ------------------------------------------------------------------------

# Records every violation the page's policy reports (run before any of the page's scripts).
LISTEN = """
window.__cspViolations = [];
document.addEventListener("securitypolicyviolation", (e) => {
  const where = e.sourceFile + ":" + e.lineNumber;
  window.__cspViolations.push(e.violatedDirective + " " + (e.blockedURI || "inline") + " " + where);
});
"""
BROWSER_PAGES = ["/console/", "/console/jobs/", "/admin/", "/admin/retention/retentionpolicy/", "/api/v1/redoc/"]


@needs_chromium
@pytest.mark.django_db(transaction=True)
def test_a_browser_reports_no_violation_on_the_console_the_admin_and_the_docs(browser, live_server, settings) -> None:
    settings.CONSOLE_REFRESH_SECONDS = 1  # let the live refresh run while the page is watched
    origin = f"http://127.0.0.1:{urlsplit(live_server.url).port}"
    user = make_user("csp-operator", "operator")
    user.is_staff = user.is_superuser = True
    user.save()
    context = browser.new_context(base_url=origin)
    context.route(re.compile(rf"^(?!{re.escape(origin)}/).*"), lambda route: route.abort())
    context.add_init_script(LISTEN)
    console_errors: list[str] = []
    page = context.new_page()
    page.on("console", lambda m: console_errors.append(m.text) if "Content Security Policy" in m.text else None)
    refreshes: list[str] = []
    page.on("request", lambda r: refreshes.append(r.url) if r.headers.get("hx-request") == "true" else None)
    seen: dict[str, list[str]] = {}
    try:
        page.goto("/accounts/login/")
        seen["/accounts/login/"] = page.evaluate("() => window.__cspViolations")
        page.get_by_label("Username").fill("csp-operator")
        page.get_by_label("Password").fill(PASSWORD)
        page.get_by_role("button", name="Log in").click()
        page.wait_for_url("**/console/")
        for path in BROWSER_PAGES:
            page.goto(path)
            page.wait_for_load_state("networkidle")
            if path.startswith("/console/"):
                # Live refreshes run (htmx under the policy: no eval, no <style> of its own).
                before = len(refreshes)
                page.wait_for_timeout(2500)
                assert len(refreshes) > before, path
            seen[path] = page.evaluate("() => window.__cspViolations")
    finally:
        context.close()

    # Redoc's footer asks for its maker's logo from its CDN; the policy blocking
    # that (nothing leaves the platform's origin) is the policy working, and
    # whether the browser reports it before the page is read is a race.
    def own(report: str) -> bool:
        return "https://cdn.redoc.ly/" not in report

    violations = {path: [v for v in found if own(v)] for path, found in seen.items()}
    assert all(not v for v in violations.values()), {path: v for path, v in violations.items() if v}
    console_errors = [e for e in console_errors if own(e)]
    assert not console_errors, console_errors
