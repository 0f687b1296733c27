"""The built book in a real browser: the quick book is built, served on localhost and
every page opened in headless Chromium (Debian's chromium and chromium-driver, which
`python3 make.py test` installs): no console errors, every image loaded, math rendered by
the bundled MathJax, no broken internal link, and the search finds a known term."""
from __future__ import annotations

import functools
import importlib.util
import http.server
import re
import shutil
import threading
import time
from pathlib import Path
from urllib.parse import unquote, urljoin, urlparse

import pytest

from attention_dynamics.book.build import build_book
from attention_dynamics.book.profiles import load_profiles


def _make():
    """make.py, the project's entry point, which finds (and as root installs) the browser."""
    spec = importlib.util.spec_from_file_location("make", Path(__file__).resolve().parents[1] / "make.py")
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


@pytest.fixture(scope="module")
def built_book(tmp_path_factory, root, quick_runs):
    for name in load_profiles(root):
        quick_runs(name)
    book = tmp_path_factory.mktemp("site") / "book"
    shutil.copytree(root / "book", book, ignore=shutil.ignore_patterns("_build", "chapters", "scorecard.md"))
    shutil.copytree(quick_runs.out_dir, book / "chapters")
    return build_book(book)


@pytest.fixture(scope="module")
def server(built_book):
    class Quiet(http.server.SimpleHTTPRequestHandler):
        def log_message(self, *args):
            pass

    handler = functools.partial(Quiet, directory=str(built_book))
    httpd = http.server.ThreadingHTTPServer(("127.0.0.1", 0), handler)
    t = threading.Thread(target=httpd.serve_forever, daemon=True)
    t.start()
    yield f"http://127.0.0.1:{httpd.server_address[1]}/"
    httpd.shutdown()


@pytest.fixture(scope="module")
def browser(tmp_path_factory):
    found = _make().find_browser()
    if found is None:
        pytest.fail("no Chromium with ChromeDriver: `python3 make.py test` installs Debian's chromium and "
                    "chromium-driver as root; elsewhere install them or set CHROME_BIN and CHROMEDRIVER")
    chromium, chromedriver = found
    from selenium import webdriver
    from selenium.webdriver.chrome.service import Service

    opts = webdriver.ChromeOptions()
    opts.binary_location = chromium
    for flag in ("--headless=new", "--no-sandbox", "--disable-gpu", "--disable-dev-shm-usage", "--disable-quic",
                 "--no-first-run", "--disable-background-networking", "--disable-component-update", "--disable-sync",
                 f"--user-data-dir={tmp_path_factory.mktemp('chrome')}"):
        opts.add_argument(flag)
    opts.set_capability("goog:loggingPrefs", {"browser": "ALL"})
    driver = webdriver.Chrome(service=Service(chromedriver), options=opts)
    driver.set_page_load_timeout(60)
    driver.set_script_timeout(60)  # MathJax and the fonts settling, a resize
    yield driver
    driver.quit()


WAIT_FOR_MATHJAX = """
const done = arguments[arguments.length - 1];
if (window.MathJax && MathJax.startup && MathJax.startup.promise) {
  MathJax.startup.promise.then(() => done(true)).catch(() => done(false));
} else { done(null); }
"""


def _pages(built_book) -> list[str]:
    return sorted(p.relative_to(built_book).as_posix() for p in built_book.rglob("*.html")
                  if not p.relative_to(built_book).as_posix().startswith("_static/"))  # theme template fragments


def test_every_page_loads_cleanly(built_book, visits):
    pages = _pages(built_book)
    assert "index.html" in pages and "scorecard.html" in pages and "chapters/routing_law.html" in pages
    problems, checked_links, math_pages = [], 0, 0
    for page in pages:
        seen = visits[page]
        problems += [f"{page}: console error: {message}" for message in seen["console_errors"]]
        problems += [f"{page}: image not loaded: {src}" for src in seen["broken_images"]]
        n_math, rendered, errors, mathjax = seen["math"]
        if n_math:
            math_pages += 1
            if mathjax is not True or rendered < n_math or errors:
                problems.append(f"{page}: math not rendered ({rendered} of {n_math} typeset, {errors} errors, MathJax {mathjax})")
        for href in seen["links"]:
            target = urlparse(href)
            if not href.startswith(visits.server):
                continue  # external links are not followed: the book must work offline
            path = built_book / unquote(target.path.removeprefix(urlparse(visits.server).path))
            if target.path.endswith("/"):
                path = path / "index.html"
            checked_links += 1
            if not path.exists():
                problems.append(f"{page}: broken internal link {href}")
    assert not problems, "\n".join(problems)
    assert checked_links > 50 and math_pages >= 5
    for page in (p for p in pages if p.startswith("chapters/")):
        assert (built_book / page).read_text().count("<img") >= 1, f"{page} shows no figure"


WIDTHS = (1280, 1366, 1440)  # the common laptop and desktop widths
# folded cells (hide-input, hide-cell: closed <details>) opened first, so that what they hide
# is measured too; then MathJax and the web fonts settle before anything is measured
UNFOLD_AND_SETTLE = """
const done = arguments[arguments.length - 1];
document.querySelectorAll('details').forEach(d => d.open = true);
const math = (window.MathJax && MathJax.startup && MathJax.startup.promise) || Promise.resolve();
Promise.all([math, document.fonts.ready]).then(() => done(true)).catch(() => done(false));
"""
WIDE_CONTROL = "document.querySelector('article').insertAdjacentHTML('beforeend', `<div style='width: 3000px'>x</div>`);"
PAGE_WIDTH = "const e = document.scrollingElement; return [window.innerWidth, e.clientWidth, e.scrollWidth];"
# every code block of the page: [visible width, content width]; inline math that is cut off
CODE_WIDTHS = "return [...document.querySelectorAll('div.cell_input pre')].map(p => [p.clientWidth, p.scrollWidth]);"
# an inline formula (its box: overflow hidden, at most the line's width) whose typeset math is
# wider than its box is cut off
CUT_MATH = ("return [...document.querySelectorAll('span.math > mjx-container')].filter(m => {"
            " const x = m.querySelector('mjx-math');"
            " return x && x.getBoundingClientRect().width > m.getBoundingClientRect().width + 1; }).length;")
CUT_CONTROL = ("document.querySelector('article').insertAdjacentHTML('beforeend', '<p><span class=\"math\">"
               "<mjx-container style=\"display: inline-block; max-width: 20px; overflow: hidden\">"
               "<mjx-math style=\"display: inline-block; width: 300px\">x</mjx-math></mjx-container></span></p>');")


def _open(browser, server, built_book, page):
    """Load `page` and, where it is a redirect (the book's index.html is a meta refresh to its
    first page), wait for the page it leads to: what a reader opening it sees. Without the
    wait, a visit measured the redirect or its target depending on timing (seen once: MathJax
    missing on index.html, its target's math typeset)."""
    browser.get(urljoin(server, page))
    refresh = re.search(r'http-equiv="Refresh" content="0; url=([^"]+)"', (built_book / page).read_text(), re.I)
    if refresh:
        target, deadline = urljoin(urljoin(server, page), refresh.group(1)), time.time() + 30
        while not (browser.current_url == target and browser.execute_script("return document.readyState") == "complete"):
            assert time.time() < deadline, f"{page}: its redirect to {target} did not load"
            time.sleep(0.05)


def _settled(browser, server, built_book, page, width):
    browser.set_window_size(width, 1000)
    _open(browser, server, built_book, page)
    assert browser.execute_async_script(UNFOLD_AND_SETTLE), f"{page}: MathJax or the fonts failed"


def _measure(browser, page, width) -> dict:
    """What the width tests read of a page laid out at `width`: the window's width as the
    page saw it, the page's [visible, content] width, the inline formulas cut off, and for a
    chapter its code blocks' [visible, content] widths; raw numbers, so that a load and a
    resize can be compared even where neither finds a problem."""
    window, client, scroll = browser.execute_script(PAGE_WIDTH)
    return {"window": window, "page": [client, scroll], "cut_math": browser.execute_script(CUT_MATH),
            "code": browser.execute_script(CODE_WIDTHS) if page.startswith("chapters/") else []}


def _too_wide(measured, page, width) -> list[str]:
    client, scroll = measured["page"]
    wide = [f"{page} at {width} px: the window is {measured['window']} px wide"] if measured["window"] != width else []
    wide += [f"{page} at {width} px: the page is {scroll} px wide in a {client} px window"] if scroll > client + 1 else []
    cut = measured["cut_math"]
    return wide + ([f"{page} at {width} px: {cut} inline formulas cut off"] if cut else [])


MATH_COUNTS = ("return [document.querySelectorAll('.math').length, document.querySelectorAll('mjx-container').length,"
               " document.querySelectorAll('mjx-merror').length];")
BROKEN_IMAGES = "return [...document.images].filter(i => !(i.complete && i.naturalWidth > 0)).map(i => i.src);"
LINKS = "return [...document.querySelectorAll('a[href]')].map(a => a.href);"
LAUNCH_LINKS = ("return [...document.querySelectorAll('.dropdown-launch-buttons a')]"
                ".map(a => [a.querySelector('.btn__text-container').textContent.trim(), a.getAttribute('href')]);")
# a resize reaches the page as a new window.innerWidth (cells.css switches the code font at
# 1440 px, so a window a few pixels off would measure another layout); once it has, the next
# frame lays the page out and a second leaves the theme's resize handlers run too. Past the
# deadline it goes on; the window width that _measure reads then fails the width tests.
RESIZED = """
const [width, done] = [arguments[0], arguments[arguments.length - 1]];
const deadline = performance.now() + 2000;  // a resize takes a frame or two; a failed one fails below
const settle = () => requestAnimationFrame(() => requestAnimationFrame(() => done(true)));
const poll = () => (window.innerWidth === width || performance.now() > deadline) ? settle() : requestAnimationFrame(poll);
poll();
"""


class Visits(dict):
    """page -> what one visit saw: as loaded (console errors, images, math, links, launch
    buttons), then with every folded cell open at each of WIDTHS, what _measure reads. One
    load per page, at the widest width (where cells.css sets the largest code font), then
    resized narrower: a resize lays the page out as a load at that width would (the same
    numbers on every page of the quick book, measured both ways;
    test_no_page_scrolls_sideways compares the two on one chapter at each width), and loads
    are most of the browser's time."""
    server: str


def _severe(browser) -> list[str]:
    return [e["message"] for e in browser.get_log("browser") if e["level"] == "SEVERE"]


@pytest.fixture(scope="module")
def visits(built_book, server, browser):
    seen = Visits()
    seen.server = server
    _severe(browser)  # what the browser logged before the first page is no page's
    for page in _pages(built_book):
        browser.set_window_size(max(WIDTHS), 1000)
        _open(browser, server, built_book, page)
        mathjax = browser.execute_async_script(WAIT_FOR_MATHJAX)
        visit = {"math": [*browser.execute_script(MATH_COUNTS), mathjax],
                 "broken_images": browser.execute_script(BROKEN_IMAGES),
                 "links": browser.execute_script(LINKS),
                 "launch_links": browser.execute_script(LAUNCH_LINKS)}
        assert browser.execute_async_script(UNFOLD_AND_SETTLE), f"{page}: MathJax or the fonts failed"
        visit["widths"] = {}
        for width in sorted(WIDTHS, reverse=True):
            browser.set_window_size(width, 1000)
            browser.execute_async_script(RESIZED, width)
            visit["widths"][width] = _measure(browser, page, width)
        # read before the next page loads: an error from unfolding or resizing is this page's too
        visit["console_errors"] = _severe(browser)
        seen[page] = visit
    browser.get("about:blank")  # what the last page logs as it is left is the last page's
    seen[page]["console_errors"] += _severe(browser)
    return seen


@pytest.mark.parametrize("width", WIDTHS)
def test_no_page_scrolls_sideways(built_book, visits, server, browser, width):
    """At each width, with every folded cell open, the page itself never scrolls sideways
    and no inline formula is cut off; a display equation or a table may scroll inside its
    own box (which does not widen the page). The page must have seen the window at that
    width, a resize must measure what a load at that width measures, and the check must
    see a page made too wide."""
    wide = [problem for page, visit in visits.items() for problem in _too_wide(visit["widths"][width], page, width)]
    assert not wide, "\n".join(wide)
    for page in ("intro.html", "chapters/value_law.html"):  # a page and a chapter; the controls on the chapter
        _settled(browser, server, built_book, page, width)
        loaded_at_width = _measure(browser, page, width)  # its window is the visit's, checked above, if they agree
        assert loaded_at_width == visits[page]["widths"][width], (
            f"{page}: a resize measured otherwise than a load: {visits[page]['widths'][width]} against {loaded_at_width}")
    browser.execute_script(CUT_CONTROL)
    assert browser.execute_script(CUT_MATH) == 1, "the check did not see a formula cut off"
    browser.execute_script(WIDE_CONTROL)
    seen = _too_wide(_measure(browser, "control", width), "control", width)
    assert any("the page is" in problem for problem in seen), "the check did not see a 3000 px wide block"


def test_no_page_shows_an_error_or_an_unresolved_reference(built_book):
    """The build already refused both (book.build.check_html, tested on known pages in
    test_build.py); the book as built still shows neither."""
    from attention_dynamics.book.build import check_html

    assert check_html(built_book) == []


@pytest.mark.parametrize("width", WIDTHS)
def test_code_cells_need_no_horizontal_scrolling(built_book, visits, server, browser, width):
    """At common laptop widths every code cell of every chapter, folded ones opened, fits its
    column; a folded cell that measured 0 px wide would hide its lines from the check."""
    chapters = sorted(page for page in visits if page.startswith("chapters/"))
    wide, measured = [], 0
    for page in chapters:
        assert visits[page]["widths"][width]["window"] == width, f"{page} was measured in another window width"
        for client, scroll in visits[page]["widths"][width]["code"]:
            measured += 1
            if client == 0 or scroll > client + 1:
                wide.append(f"{page}: a code cell {scroll} px wide in a {client} px column")
    assert not wide, "\n".join(wide)
    assert measured > 100  # every chapter's cells, the folded ones included
    _settled(browser, server, built_book, chapters[-1], width)  # the control, on a chapter
    browser.execute_script("document.querySelector('div.cell_input pre').textContent += ' ' + 'x'.repeat(300);")
    assert any(s > c + 1 for c, s in browser.execute_script(CODE_WIDTHS)), "the check did not see a long line"


def test_chapter_headers_launch_the_source_notebook(root, built_book, visits):
    """The Binder and Colab buttons in a chapter's header open notebooks/NAME.ipynb of the
    configured branch, the addresses of the chapter's provenance footer, not the executed
    copy the page was built from; pages that are not chapters have no launch buttons."""
    from attention_dynamics.book.provenance import launch_links, repository

    repo = repository(root)
    chapters = sorted(p.stem for p in (built_book / "chapters").glob("*.html"))
    assert "value_law" in chapters
    for name in chapters:
        links = dict(visits[f"chapters/{name}.html"]["launch_links"])
        assert set(links) == {"Binder", "Colab"}, f"{name}: {links}"
        assert links["Binder"].endswith(f"?labpath=notebooks%2F{name}.ipynb"), links["Binder"]
        assert links["Colab"].endswith(f"/blob/{repo['branch']}/notebooks/{name}.ipynb"), links["Colab"]
        assert links == launch_links(repo, name)  # the footer's addresses, written in one place
    for page in ("index.html", "scorecard.html", "rerun.html"):
        assert visits[page]["launch_links"] == [], page


def test_search_finds_a_known_term(server, browser):
    browser.get(urljoin(server, "search.html?q=responsibility"))
    deadline = time.time() + 30
    hits = []
    while time.time() < deadline:
        hits = browser.execute_script(
            "return [...document.querySelectorAll('#search-results li a')].map(a => a.getAttribute('href'));")
        if hits:
            break
        time.sleep(0.25)
    assert any("value_law" in h for h in hits), hits


def test_mathjax_is_served_locally(built_book):
    page = (built_book / "chapters" / "routing_law.html").read_text()
    assert '_static/mathjax/tex-chtml.js' in page and "cdn.jsdelivr" not in page
    assert (built_book / "_static" / "mathjax" / "tex-chtml.js").is_file()
