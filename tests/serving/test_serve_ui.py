"""The recall inspector at ``/ui``: static files served by the service with a strict CSP, and,
in Debian's chromium driven by Playwright, a page that loads a user's pages and facts, runs a
recall and shows every part of the answer, renders user text (a ``<script>`` turn included) as
text only, keeps a right-to-left override inside its turn and a 300-character token inside the
window, keeps the key in sessionStorage alone and talks to no host but the service. ``/docs``
and ``/redoc``, when the config turns them on, talk to no host but the CDN it names."""

from __future__ import annotations

import os
import re
import shutil
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any
from urllib.parse import urlsplit

import httpx
import pytest

import memsifter.serving.app as app_module
from memsifter.coarse import build_filter
from memsifter.ranker.spec import PromptSpec
from memsifter.resources import RESOURCES
from memsifter.serving.config import ApiKeySettings, ServeConfig
from memsifter.serving.ranking import ServiceRanker
from memsifter.serving.store import hash_key
from memsifter.testing.backends import ScriptedBackend, n_candidates
from memsifter.testing.server import live_server

KEY = "key-serve-ui-0123456789"
USER = "alice"
CHROMIUM = "/usr/bin/chromium"
UI_DIR = RESOURCES / "ui"
ARTIFACT = Path(__file__).resolve().parents[2] / "outputs" / "test_artifacts" / "ui_recall.png"
EVIL = '<script>window.__pwned = 1</script><img src=x onerror="window.__pwned=2">'
# The proxy's think text is server-provided too (a model can be talked into writing markup).
THINK = 'The beagle Max is the answer. <b>bold?</b><img src=y onerror="window.__pwned=3">'
DOG_TEXT = "I adopted a dog named Max last spring; he is a beagle."
# Hostile to the layout rather than the DOM: one 300-character token (YAKE makes a keyword chip
# of it), and a right-to-left override that would reorder what follows it in its line.
LONG_TOKEN = "Supercalifragilistic" * 15
RLO_TEXT = "before \u202e after"
CDN = "cdn.jsdelivr.net"
CHROME_ARGS = [
    "--no-sandbox",
    "--disable-gpu",
    "--disable-quic",
    "--no-first-run",
    "--disable-background-networking",
    "--disable-component-update",
    "--disable-sync",
]


@pytest.fixture(scope="module")
def base_url(tmp_path_factory: pytest.TempPathFactory) -> Iterator[str]:
    db = tmp_path_factory.mktemp("serve_ui") / "memsifter.db"
    config = ServeConfig(
        db_url=f"sqlite:///{db}",
        api_keys=[ApiKeySettings(tenant="acme", key_sha256=hash_key(KEY))],
        api_docs_from_cdn=True,  # on here, so the browser checks which hosts those pages use
    )

    # A proxy ranker over a scripted model (think text, then the candidates in coarse order),
    # so the page shows a real proxy answer: think, parse and the proxy's timings. live_server
    # builds the app with create_app(config); it gets this ranker through the module attribute.
    def respond(prompt: str) -> str:
        ids = ", ".join(str(i) for i in range(n_candidates(prompt)))
        return f"<think>{THINK}</think><ranking>{ids}</ranking>"

    ranker = ServiceRanker(build_filter("bm25"), ScriptedBackend(respond), PromptSpec())
    real = app_module.create_app
    with pytest.MonkeyPatch.context() as mp:
        mp.setattr(app_module, "create_app", lambda config: real(config, ranker))
        with live_server(config) as url:
            _seed(url)
            yield url


def _seed(url: str) -> None:
    sessions = [
        {
            "id": "2024-05-01-evening",
            "date": "2024-05-01T19:00:00Z",
            "date_text": "1 May 2024",
            "turns": [
                {"speaker": "user", "text": DOG_TEXT},
                {"speaker": "assistant", "text": "Max sounds lovely. How old is your dog?"},
                {"speaker": "user", "text": "Max is two years old and loves the park."},
                {"speaker": "user", "text": EVIL},
            ],
        },
        {
            "id": "2024-05-03-kitchen",
            "date": "2024-05-03T12:00:00Z",
            "turns": [
                {"speaker": "user", "text": "I am baking sourdough bread this weekend."},
                {"speaker": "assistant", "text": "Keep the starter warm and feed it daily."},
            ],
        },
        {
            "id": "2024-05-05-hostile",
            "date": "2024-05-05T10:00:00Z",
            "turns": [
                {"speaker": "user", "text": f"I keep writing {LONG_TOKEN} about my dog."},
                {"speaker": "user", "text": RLO_TEXT, "timestamp": "2024-05-05T10:00:00Z"},
            ],
        },
    ]
    headers = {"Authorization": f"Bearer {KEY}"}
    with httpx.Client(base_url=url, headers=headers, timeout=60) as c:
        r = c.post(f"/v1/users/{USER}/sessions", json={"sessions": sessions})
        assert r.status_code == 201, r.text
        fact = {"type": "entity", "subject": "dog", "text": "The user's dog is called Max."}
        r = c.post(f"/v1/users/{USER}/facts", json=fact)
        assert r.status_code == 201, r.text


# ------------------------------------------------------------------------------- no browser


def test_ui_static_files_are_served_with_a_strict_csp(base_url: str) -> None:
    with httpx.Client(base_url=base_url, timeout=30) as c:
        r = c.get("/ui", follow_redirects=False)
        assert r.status_code in (301, 302, 307, 308), r.text
        assert c.get("/ui", follow_redirects=True).url.path == "/ui/"

        page = c.get("/ui/")
        assert page.status_code == 200
        assert page.headers["content-type"].startswith("text/html")
        assert "recall inspector" in page.text
        csp = page.headers["content-security-policy"]
        directives = {d.split()[0]: d.split()[1:] for d in csp.split(";") if d.strip()}
        assert directives["default-src"] == ["'self'"]
        assert directives["script-src"] == ["'self'"]
        assert "unsafe-inline" not in csp and "unsafe-eval" not in csp
        assert page.headers["x-content-type-options"] == "nosniff"
        assert page.headers["x-request-id"]  # the request middleware applies
        assert c.head("/ui/").status_code == 200

        for name, kind in (("app.js", "javascript"), ("style.css", "text/css")):
            r = c.get(f"/ui/{name}")
            assert r.status_code == 200, name
            assert kind in r.headers["content-type"], (name, r.headers["content-type"])
            assert "content-security-policy" in r.headers
            assert r.text == (UI_DIR / name).read_text()

        # Unknown files are the API's JSON 404; nothing outside the folder is reachable.
        r = c.get("/ui/nope.js")
        assert r.status_code == 404 and r.json()["error"]["type"] == "http_error"
        assert c.get("/ui/%2e%2e/__init__.py").status_code == 404

        # The mount stays out of the OpenAPI schema (schemathesis walks it).
        paths = c.get("/openapi.json").json()["paths"]
        assert not [p for p in paths if p.startswith("/ui")]
        assert "/v1/users/{user_id}/recall" in paths

    # Every file is local: no URL of any host, no protocol-relative src/href, no inline script,
    # no inline handlers or style attributes (the CSP would block them), no HTML-parsing sinks.
    files = sorted(p for p in UI_DIR.iterdir() if p.is_file())
    assert {p.name for p in files} >= {"index.html", "app.js", "style.css", "favicon.svg"}
    for path in files:
        # An SVG's namespace is a name, never fetched; any other http(s) URL fails.
        text = path.read_text().replace('xmlns="http://www.w3.org/2000/svg"', "")
        assert not re.search(r"(?i)\bhttps?://", text), path.name
        assert not re.search(r"""(?i)(src|href|url)\s*[=(]\s*["']?//""", text), path.name
        assert "@import" not in text, path.name
    html = (UI_DIR / "index.html").read_text()
    scripts = re.findall(r"<script\b[^>]*>(.*?)</script>", html, flags=re.S | re.I)
    assert scripts and all(s.strip() == "" for s in scripts)
    assert all("src=" in tag for tag in re.findall(r"<script\b[^>]*>", html, flags=re.I))
    assert not re.search(r"""(?i)\son[a-z]+\s*=""", html)
    assert not re.search(r"""(?i)\sstyle\s*=""", html)
    js = (UI_DIR / "app.js").read_text()
    for sink in ("innerHTML", "outerHTML", "insertAdjacentHTML", "document.write", "eval("):
        assert sink not in js, sink
    assert not re.search(r"\b(localStorage|document\.cookie)\s*[.\[=]", js)
    assert "sessionStorage.setItem" in js


def test_api_docs_are_on_only_when_configured_and_name_only_their_cdn(base_url: str) -> None:
    # Off by default (tests/serving/test_serve_bad_input.py: a 404); this server turns them on.
    with httpx.Client(base_url=base_url, timeout=30) as c:
        for path in ("/docs", "/redoc"):
            page = c.get(path)
            assert page.status_code == 200 and page.headers["content-type"].startswith("text/html")
            urls = re.findall(r"""(?:src|href|url)\s*[=:]\s*["']([^"']+)["']""", page.text)
            hosts = {urlsplit(u).netloc for u in urls}
            # FastAPI's own pages add fastapi.tiangolo.com (favicon), fonts.googleapis.com
            # (ReDoc) and validator.swagger.io (Swagger UI); these name the CDN alone.
            assert hosts == {"", CDN}, (path, urls)
            assert "openapi.json" in urls or 'spec-url="openapi.json"' in page.text, path
        assert '"validatorUrl": null' in c.get("/docs").text
        assert c.get("/openapi.json").status_code == 200
        paths = c.get("/openapi.json").json()["paths"]
        assert "/docs" not in paths and "/redoc" not in paths


# ---------------------------------------------------------------------------------- browser


def _browser_or_skip() -> None:
    missing = []
    if not Path(CHROMIUM).exists():
        missing.append(f"{CHROMIUM} (Debian's chromium: apt-get install chromium)")
    try:
        import playwright.sync_api  # noqa: F401
    except ImportError:
        missing.append("the playwright Python package (the dev extra)")
    if not missing:
        return
    why = "the inspector's browser test needs " + " and ".join(missing)
    if os.environ.get("MEMSIFTER_REQUIRE_BROWSER") == "1":
        pytest.fail(why + "; MEMSIFTER_REQUIRE_BROWSER=1 forbids skipping", pytrace=False)
    pytest.skip(why)


# True when the turn's timestamp starts right of everything before it in the turn: an override
# that leaked out of the turn's text would have moved the timestamp to the text's left.
_TIMESTAMP_AFTER_TEXT = """turn => {
  const stamp = turn.lastElementChild;
  const before = document.createRange();
  before.setStartBefore(turn.firstChild);
  before.setEndBefore(stamp);
  return stamp.getBoundingClientRect().left >= before.getBoundingClientRect().right - 0.5;
}"""


def _assert_fits_the_window(page: Any) -> None:
    width = page.evaluate(
        "() => [document.documentElement.scrollWidth, document.body.scrollWidth, innerWidth]"
    )
    assert max(width[:2]) <= width[2], f"the page is {width[:2]} px wide in a {width[2]} px window"


@pytest.mark.slow
def test_ui_recall_in_a_browser(base_url: str, tmp_path: Path) -> None:
    _browser_or_skip()
    from playwright.sync_api import expect, sync_playwright

    origin = urlsplit(base_url)
    requests: list[str] = []
    console_errors: list[str] = []
    with sync_playwright() as p:
        browser = p.chromium.launch(executable_path=CHROMIUM, headless=True, args=CHROME_ARGS)
        try:
            context = browser.new_context(viewport={"width": 1400, "height": 1000})
            page = context.new_page()
            page.on("request", lambda r: requests.append(r.url))
            page.on(
                "console", lambda m: console_errors.append(m.text) if m.type == "error" else None
            )
            page.set_default_timeout(20_000)
            expect.set_options(timeout=20_000)

            page.goto(f"{base_url}/ui/")
            expect(page.locator("body[data-ready='1']")).to_have_count(1)
            expect(page.locator("h1")).to_have_text("MemSifter recall inspector")

            # A wrong key: the API's 401 is shown as a message, with its request id.
            page.fill("#key", "not-the-key")
            page.click("#save-key")
            page.fill("#user", USER)
            page.click("#load-user")
            error = page.locator("#messages .message.error").first
            expect(error).to_contain_text("401")
            expect(error).to_contain_text("unauthorized")
            expect(error).to_contain_text("request id:")

            # The right key, then the user's sessions, pages (with bookmarks) and facts.
            page.fill("#key", KEY)
            page.click("#save-key")
            expect(page.locator("#key-state")).to_have_text("key set (this tab only)")
            assert page.input_value("#key") == ""  # not left in the field either
            page.click("#load-user")
            expect(page.locator("#sessions-table tbody tr")).to_have_count(3)
            expect(page.locator("#sessions-total")).to_contain_text("3")
            expect(page.locator("#facts-table")).to_contain_text("The user's dog is called Max.")
            expect(page.locator("#messages .message.error")).to_have_count(0)

            row = page.locator("#sessions-table tr[data-session-id='2024-05-01-evening']")
            row.locator("button.show-pages").click()
            detail = page.locator("#session-detail")
            expect(detail.locator(".page").first).to_be_visible()
            expect(detail).to_contain_text(DOG_TEXT)
            assert detail.locator(".chip").count() > 0, "the page's keyword bookmarks"
            # The hostile turn is text, literally: no element came of it.
            expect(detail).to_contain_text(EVIL)
            assert detail.locator("script, img").count() == 0

            # Hostile layout: the 300-character keyword and token wrap inside their panels, and
            # the override stays in its turn (the turn's timestamp is still to its right).
            row = page.locator("#sessions-table tr[data-session-id='2024-05-05-hostile']")
            row.locator("button.show-pages").click()
            expect(detail).to_contain_text(RLO_TEXT)
            # The store keeps 200 characters of a keyword: still ~1,400 px of one word.
            longest = "ns => Math.max(...ns.map(n => n.textContent.length))"
            assert detail.locator(".chip").evaluate_all(longest) >= 200
            _assert_fits_the_window(page)
            turn = detail.locator(".turn", has_text="after").first
            expect(turn.locator(":scope > :last-child")).to_contain_text("2024-05-05T10:00:00")
            assert turn.evaluate(_TIMESTAMP_AFTER_TEXT), "the override reordered its line"
            styles = detail.locator(".turn bdi").evaluate_all(
                "nodes => nodes.map(n => getComputedStyle(n).unicodeBidi)"
            )
            assert styles and set(styles) == {"isolate"}, styles

            # Recall.
            page.fill("#question", "What is the name of my dog?")
            page.fill("#top-k", "3")
            page.click("#recall-btn")
            hits = page.locator("#hits li.hit")
            expect(hits.first).to_be_visible()
            first = hits.first
            expect(first).to_contain_text(DOG_TEXT)
            expect(first).to_contain_text("2024-05-01-evening")
            expect(first).to_contain_text("#1")
            for name in ("score", "coarse_score", "bookmark_score", "date", "page", "session"):
                expect(
                    first.locator(".field .name", has_text=re.compile(f"^{name}$"))
                ).to_have_count(1)
            expect(first).to_contain_text("1 May 2024")
            expect(first.locator(".hit-text")).to_contain_text(EVIL)
            ranker = httpx.get(f"{base_url}/healthz").json()["ranker"]
            assert ranker.startswith("proxy:")
            expect(page.locator("#ranker")).to_have_text(ranker)
            timings = page.locator("#timings")
            for name in ("index_load", "index_ms", "coarse_ms", "proxy_ms", "model_ms", "total_ms"):
                expect(timings).to_contain_text(name)
            # Which load it was is the API's to test (tests/serving/test_serve_api.py); here, that
            # the
            # page shows the kind the API returned, not a dash.
            load = timings.locator("tr", has_text="index_load").locator("td").inner_text()
            assert load in ("warm", "waited", "caught_up", "rebuilt"), load
            for name in ("index_ms", "coarse_ms", "proxy_ms", "model_ms", "total_ms"):
                cell = timings.locator("tr", has_text=name).locator("td").inner_text()
                assert float(cell) >= 0, (name, cell)  # a number, not the "—" of a null
            parse = page.locator("#parse")
            expect(parse.locator("tr", has_text="status").locator("td")).to_have_text("ok")
            # Every page is a candidate (the user has three) and the model ranked them all.
            expect(parse.locator("tr", has_text="n_from_model").locator("td")).to_have_text("3")
            expect(parse.locator("tr", has_text="shown").locator("td")).to_have_text("3")
            expect(page.locator("#think")).to_have_text(THINK)
            assert page.locator("#recall-result script, #recall-result img, #think b").count() == 0

            # An API refusal during recall is a message too (top_k over the limit: a 422).
            page.fill("#top-k", "1000")
            page.click("#recall-btn")
            expect(page.locator("#messages .message.error")).to_contain_text("validation_error")
            expect(page.locator("#messages .message.error")).to_contain_text("body.top_k")
            page.fill("#top-k", "3")
            page.click("#recall-btn")
            expect(page.locator("#messages .message.error")).to_have_count(0)
            expect(hits.first).to_contain_text(DOG_TEXT)
            expect(page.locator("#hits")).to_contain_text(LONG_TOKEN)  # every page is a hit
            _assert_fits_the_window(page)
            page.set_viewport_size({"width": 700, "height": 1000})  # one column
            _assert_fits_the_window(page)
            page.set_viewport_size({"width": 1400, "height": 1000})

            assert page.evaluate("typeof window.__pwned") == "undefined"
            stored = page.evaluate("() => ({...window.sessionStorage})")
            assert KEY in stored.values(), stored
            assert page.evaluate("() => JSON.stringify({...window.localStorage})") == "{}"
            assert page.evaluate("document.cookie") == ""
            assert not context.cookies()
            assert KEY not in page.url

            ARTIFACT.parent.mkdir(parents=True, exist_ok=True)
            page.screenshot(path=str(ARTIFACT), full_page=True)
            shutil.copyfile(ARTIFACT, tmp_path / "ui_recall.png")
            time.sleep(0.2)  # let any late request (a favicon) be recorded

            # /docs and /redoc (on for this server) may ask the CDN their option names and no
            # other host. Those requests are recorded, then aborted: the test runs offline.
            docs_requests: list[str] = []
            docs = context.new_page()
            docs.route(lambda url: urlsplit(url).netloc != origin.netloc, lambda r: r.abort())
            docs.on("request", lambda r: docs_requests.append(r.url))
            for path in ("/docs", "/redoc"):
                docs.goto(f"{base_url}{path}")
            time.sleep(0.2)
        finally:
            browser.close()

    assert requests, "no request recorded"
    elsewhere = [u for u in requests if urlsplit(u).netloc != origin.netloc]
    assert not elsewhere, f"requests left for another host: {elsewhere}"
    assert not [u for u in requests if KEY in u], "the key appeared in a URL"
    assert not any(u.endswith(("/ui/x", "/ui/y")) for u in requests), "a hostile <img> rendered"
    docs_hosts = {urlsplit(u).netloc for u in docs_requests} - {origin.netloc}
    assert docs_hosts == {CDN}, docs_requests
    # The 401 and 422 above are logged by chromium as failed resources; nothing else may be.
    unexpected = [
        m for m in console_errors if "status of 401" not in m and "status of 422" not in m
    ]
    assert not unexpected, unexpected
