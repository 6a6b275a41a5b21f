"""Check the built site in a real browser, as a reader on a laptop and on a phone meets it.

    python tools/check_browser.py [_build/html] [--mathjax _build/mathjax] [--widths 1280,390]

Every page of the site is opened in headless Chromium (the system's package;
it is driven over the DevTools protocol) at each width, after its scripts and
MathJax have run. MathJax comes from a local copy (the npm package, unpacked by
`make book`): the browser's requests for the CDN's MathJax are answered from it,
and every other request that would leave the machine is refused, so the check
runs offline. A page fails if

* MathJax reports an error (an ``mjx-merror`` node), or TeX is left as raw text
  (``\\frac``, ``$$`` outside code and formulas);
* a display equation is wider than its column and no box around it scrolls
  (clipped), or the page itself is wider than the window;
* an image did not load;
* a code listing wraps its lines instead of scrolling (it would break Python's
  indentation), or a cell's printed output is split into several boxes;
* a printed table (rows of ``|``-separated columns, or a ``---+---`` rule) is
  shown as text instead of a ``<table>``;
* a script raised an error while the page loaded;
* on the widest screen, a figure's text would show below 9 px (its 10-point
  labels, at the resolution its PNG records and the scale the page shows it at);
* the navigation does not open: on a phone-sized window, tapping the visible
  contents button must show the site navigation; on a wide one, the same
  button must hide and show the sidebar.

Exit status 1 lists each defect as ``page @ width: what``. Also printed: the
height of every page at every width.
"""

from __future__ import annotations

import argparse
import asyncio
import base64
import json
import mimetypes
import os
import shutil
import subprocess
import sys
import tempfile
import time
import urllib.request
from pathlib import Path

from tornado.websocket import websocket_connect

ROOT = Path(__file__).resolve().parents[1]
MATHJAX_PREFIXES = ("mathjax@3/", "mathjax@3.2.2/")
# A figure's tick labels are matplotlib's default 10 points unless it sets them
# smaller; shown at the scale the page gives the figure, they must be this many px.
MIN_FIGURE_PT, MIN_FIGURE_PX = 10, 9

# Run in the page once MathJax has typeset it: a list of [kind, detail] defects
# and a few measurements.
PAGE_CHECK = r"""
(() => {
  const defects = [], add = (kind, detail) => defects.push([kind, String(detail).slice(0, 120)]);
  const article = document.querySelector('article') || document.querySelector('main') || document.body;
  const viewport = document.documentElement.clientWidth;
  for (const e of document.querySelectorAll('mjx-merror, [data-mjx-error]'))
    add('MathJax error', e.getAttribute('data-mjx-error') || e.textContent);
  const SKIP = 'script, style, pre, code, textarea, mjx-container, .highlight, .MathJax';
  const walker = document.createTreeWalker(article, NodeFilter.SHOW_TEXT);
  const raw = /\\(?:[A-Za-z]{2,}|[{}|,;!])|\$\$|\$[^$\s][^$]*[\\^_{}][^$]*\$/;
  for (let n = walker.nextNode(); n; n = walker.nextNode()) {
    const el = n.parentElement;
    if (!el || el.closest(SKIP)) continue;
    if (raw.test(n.data)) add('raw TeX in text', n.data.trim());
  }
  const scrolls = el => /(auto|scroll)/.test(getComputedStyle(el).overflowX);
  for (const c of article.querySelectorAll('mjx-container[display="true"], mjx-container[display="block"]')) {
    const math = c.firstElementChild || c, right = math.getBoundingClientRect().right;
    let limit = Math.min(viewport, article.getBoundingClientRect().right), scroller = false;
    for (let el = c; el && el !== article.parentElement; el = el.parentElement) {
      if (scrolls(el)) { scroller = true; break; }
      limit = Math.min(limit, el.getBoundingClientRect().right);
    }
    if (!scroller && right > limit + 1)
      add('display equation clipped', `${Math.round(right - limit)} px: ` + (c.textContent || '').slice(0, 60));
  }
  if (document.documentElement.scrollWidth > viewport + 1) {
    let culprit = '';
    const over = el => { const r = el.getBoundingClientRect();
                         return r.width > 0 && r.left < viewport && r.right > viewport + 1; };
    for (const el of article.querySelectorAll('*')) {
      if (over(el) && !el.closest('pre, div.math, .pst-scrollable-table-container, .table-wrapper')
          && !Array.from(el.children).some(over)) {
        culprit = `${el.tagName.toLowerCase()}.${el.className}: ${(el.textContent || '').trim().slice(0, 40)}`;
        break;
      }
    }
    add('page wider than the window', `${document.documentElement.scrollWidth} px > ${viewport} px (${culprit})`);
  }
  for (const img of document.querySelectorAll('img'))
    if (!img.complete || img.naturalWidth === 0) add('image not loaded', img.getAttribute('src'));
  for (const pre of article.querySelectorAll('div.highlight pre, div.cell_output pre, div.output pre')) {
    const ws = getComputedStyle(pre).whiteSpace;
    if (ws !== 'pre') { add('listing wraps its lines', `white-space: ${ws}`); break; }
  }
  for (const out of article.querySelectorAll('div.cell_output')) {
    const streams = out.querySelectorAll(':scope > div.output.stream');
    if (streams.length > 1) add('printed output split into boxes', `${streams.length} boxes: ` + streams[0].textContent.trim().slice(0, 50));
  }
  for (const pre of article.querySelectorAll('div.cell_output pre, div.output pre')) {
    const lines = pre.textContent.split('\n');
    const rows = lines.filter(l => (l.match(/ \| /g) || []).length >= 2).length;
    if (rows >= 3 || lines.some(l => /^\s*-{3,}(\+-{3,})+\s*$/.test(l)))
      add('table printed as text', lines[0].slice(0, 60));
  }
  const figures = [];
  for (const img of article.querySelectorAll('img'))
    if (img.naturalWidth) figures.push([img.getAttribute('src'), img.getBoundingClientRect().width / img.naturalWidth]);
  return {defects, height: document.documentElement.scrollHeight, figures};
})()
"""

# Is the primary sidebar (the site navigation) on screen?
SIDEBAR_SHOWN = r"""
(() => {
  const bar = document.querySelector('#pst-primary-sidebar, .bd-sidebar-primary');
  if (!bar) return false;
  const r = bar.getBoundingClientRect(), s = getComputedStyle(bar);
  return r.width > 100 && r.right > 100 && r.left < document.documentElement.clientWidth - 100
         && s.visibility !== 'hidden' && s.display !== 'none' && parseFloat(s.opacity || 1) > 0.5;
})()
"""

# The centre of the first visible element matching a selector, or null.
VISIBLE = r"""
((sel) => {
  for (const e of document.querySelectorAll(sel)) {
    const r = e.getBoundingClientRect();
    if (r.width > 0 && r.height > 0 && getComputedStyle(e).visibility !== 'hidden'
        && r.top >= 0 && r.top < window.innerHeight)
      return [r.left + r.width / 2, r.top + r.height / 2];
  }
  return null;
})
"""


class Browser:
    """A headless Chromium and one tab of it, over the DevTools protocol."""

    def __init__(self, executable, mathjax):
        self.mathjax = Path(mathjax) if mathjax else None
        self.profile = tempfile.mkdtemp(prefix="check-browser-")
        self.proc = subprocess.Popen(
            [executable, "--headless=new", "--no-sandbox", "--disable-gpu",
             "--no-first-run", "--no-default-browser-check", "--hide-scrollbars",
             "--allow-file-access-from-files", "--remote-debugging-port=0",
             f"--user-data-dir={self.profile}", "about:blank"],
            stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
        self.ids, self.pending, self.listeners, self.errors = 0, {}, [], []

    async def start(self):
        port_file = Path(self.profile) / "DevToolsActivePort"
        for _ in range(200):
            if port_file.exists() and port_file.read_text().strip():
                break
            await asyncio.sleep(0.1)
        port = int(port_file.read_text().split()[0])
        with urllib.request.urlopen(f"http://127.0.0.1:{port}/json/list") as r:
            page = next(t for t in json.load(r) if t["type"] == "page")
        self.ws = await websocket_connect(page["webSocketDebuggerUrl"], max_message_size=1 << 28)
        self.reader = asyncio.ensure_future(self._read())
        await self.send("Page.enable")
        await self.send("Runtime.enable")
        await self.send("Fetch.enable", patterns=[{"urlPattern": "http*"}])

    async def _read(self):
        while True:
            msg = await self.ws.read_message()
            if msg is None:
                return
            msg = json.loads(msg)
            if "id" in msg:
                fut = self.pending.pop(msg["id"], None)
                if fut and not fut.done():
                    fut.set_result(msg)
            elif msg.get("method") == "Fetch.requestPaused":
                asyncio.ensure_future(self._answer(msg["params"]))
            else:
                if msg.get("method") == "Runtime.exceptionThrown":
                    d = msg["params"]["exceptionDetails"]
                    self.errors.append((d.get("exception") or {}).get("description") or d.get("text"))
                for fut, method in list(self.listeners):
                    if msg.get("method") == method and not fut.done():
                        fut.set_result(msg["params"])

    async def send(self, method, **params):
        self.ids += 1
        fut = asyncio.get_running_loop().create_future()
        self.pending[self.ids] = fut
        self.ws.write_message(json.dumps({"id": self.ids, "method": method, "params": params}))
        msg = await asyncio.wait_for(fut, 60)
        if "error" in msg:
            raise RuntimeError(f"{method}: {msg['error']}")
        return msg.get("result", {})

    async def _answer(self, req):
        """MathJax from the local copy; anything else off the machine refused."""
        url = req["request"]["url"].split("?")[0]
        local = None
        for prefix in MATHJAX_PREFIXES:
            if self.mathjax and prefix in url:
                local = self.mathjax / url.split(prefix, 1)[1]
        if local and local.is_file():
            kind = mimetypes.guess_type(local.name)[0] or "application/octet-stream"
            await self.send("Fetch.fulfillRequest", requestId=req["requestId"], responseCode=200,
                            responseHeaders=[{"name": "Content-Type", "value": kind},
                                             {"name": "Access-Control-Allow-Origin", "value": "*"}],
                            body=base64.b64encode(local.read_bytes()).decode())
        else:
            await self.send("Fetch.failRequest", requestId=req["requestId"],
                            errorReason="BlockedByClient")

    def event(self, method):
        fut = asyncio.get_running_loop().create_future()
        self.listeners.append((fut, method))
        return fut

    async def evaluate(self, expression):
        r = await self.send("Runtime.evaluate", expression=expression,
                            returnByValue=True, awaitPromise=True)
        if "exceptionDetails" in r:
            raise RuntimeError(r["exceptionDetails"])
        return r["result"].get("value")

    async def open(self, url, width):
        await self.send("Emulation.setDeviceMetricsOverride", width=width, height=900,
                        deviceScaleFactor=1, mobile=width < 600)
        loaded = self.event("Page.loadEventFired")
        self.errors = []
        await self.send("Page.navigate", url=url)
        await asyncio.wait_for(loaded, 30)
        await self.evaluate("(async () => { if (window.MathJax && MathJax.startup && "
                            "MathJax.startup.promise) await MathJax.startup.promise; "
                            "await new Promise(r => setTimeout(r, 200)); })()")

    async def click(self, selector):
        where = await self.evaluate(VISIBLE + f"({json.dumps(selector)})")
        if not where:
            return False
        x, y = where
        for kind in ("mousePressed", "mouseReleased"):
            await self.send("Input.dispatchMouseEvent", type=kind, x=x, y=y,
                            button="left", clickCount=1)
        await asyncio.sleep(0.4)
        return True

    async def screenshot(self, path):
        shot = await self.send("Page.captureScreenshot", format="png")
        Path(path).write_bytes(base64.b64decode(shot["data"]))

    async def close(self):
        try:
            await self.send("Browser.close")
        except Exception:
            pass
        self.proc.terminate()
        try:
            self.proc.wait(10)
        except subprocess.TimeoutExpired:
            self.proc.kill()
        shutil.rmtree(self.profile, ignore_errors=True)


async def check_page(browser, path, width, shots=None):
    """([defect], measurements) of one page at one width; screenshots into shots."""
    await browser.open(path.resolve().as_uri(), width)
    result = await browser.evaluate(PAGE_CHECK)
    defects = [f"{kind}: {detail}" for kind, detail in result["defects"]]
    defects += [f"script error: {e.splitlines()[0][:120]}" for e in browser.errors]
    if shots:
        await browser.screenshot(Path(shots) / f"{path.stem}-{width}.png")
    before = await browser.evaluate(SIDEBAR_SHOWN)
    if await browser.click(".primary-toggle"):
        after = await browser.evaluate(SIDEBAR_SHOWN)
        if shots:
            await browser.screenshot(Path(shots) / f"{path.stem}-{width}-nav.png")
        if width < 992 and not after:
            defects.append("navigation: the contents button does not open the site navigation")
        elif width >= 992 and after == before:
            defects.append("navigation: the sidebar button does not hide the sidebar")
    elif width < 992:
        defects.append("navigation: no visible contents button")
    return defects, result


def png_dpi(path):
    """The resolution a PNG records (its pHYs chunk; matplotlib writes the figure's dpi), or None."""
    try:
        data = Path(path).read_bytes()
    except OSError:
        return None
    at = data.find(b"pHYs", 8, 4096)
    if not data.startswith(b"\x89PNG") or at < 0:
        return None
    x, unit = int.from_bytes(data[at + 4:at + 8], "big"), data[at + 12]
    return x * 0.0254 if unit == 1 else None


def figure_text_px(page, src, scale):
    """The size on screen of a figure's smallest default text (MIN_FIGURE_PT points), in px."""
    dpi = png_dpi((page.parent / src.split("?")[0]).resolve()) if src and "://" not in src else None
    return None if not dpi else MIN_FIGURE_PT * dpi / 72 * scale


def find_chromium():
    for name in ("chromium", "chromium-browser", "google-chrome", "chrome"):
        if shutil.which(name):
            return shutil.which(name)
    raise SystemExit("no Chromium found: `apt-get install chromium` (make book installs it)")


async def check(site, mathjax=None, widths=(1280, 390), executable=None, log=print, shots=None):
    """{(page, width): [defect]} over every page of a built site; log prints measurements."""
    site = Path(site)
    pages = sorted(p for p in site.rglob("*.html")
                   if not p.relative_to(site).parts[0].startswith(("_", "."))
                   and p.name not in ("search.html", "genindex.html")
                   and 'http-equiv="refresh"' not in p.read_text(errors="replace")[:2000].lower())
    browser = Browser(executable or find_chromium(), mathjax)
    problems = {}
    try:
        await browser.start()
        for page in pages:
            name = str(page.relative_to(site))
            heights = []
            for width in widths:
                defects, result = await check_page(browser, page, width, shots)
                heights.append(f"{result['height']} px @ {width}")
                if defects:
                    problems[(name, width)] = defects
                if width == max(widths):    # figure text, measured on the widest screen
                    for src, scale in result["figures"]:
                        px = figure_text_px(page, src, scale)
                        if px is not None and px < MIN_FIGURE_PX:
                            problems.setdefault((name, width), []).append(
                                f"figure text too small: {MIN_FIGURE_PT} pt shows as {px:.1f} px "
                                f"({Path(src).name[:24]}, shown at {scale:.0%})")
            log(f"{name}: {', '.join(heights)}")
    finally:
        await browser.close()
    return problems


def main(argv=None):
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("site", nargs="?", default=str(ROOT / "_build" / "html"))
    parser.add_argument("--mathjax", default=str(ROOT / "_build" / "mathjax"),
                        help="an unpacked MathJax 3 npm package (the folder holding es5/)")
    parser.add_argument("--widths", default="1280,390")
    parser.add_argument("--screenshots", help="a folder to save each page's first screen in")
    args = parser.parse_args(argv)
    mathjax = Path(args.mathjax)
    if not (mathjax / "es5" / "tex-chtml.js").exists():
        raise SystemExit(f"no MathJax 3 in {args.mathjax} (make book unpacks npm's mathjax@3 there)")
    start = time.time()
    if args.screenshots:
        Path(args.screenshots).mkdir(parents=True, exist_ok=True)
    problems = asyncio.run(check(args.site, mathjax, [int(w) for w in args.widths.split(",")],
                                 shots=args.screenshots))
    for (name, width), defects in sorted(problems.items()):
        for d in defects:
            print(f"{name} @ {width}: {d}")
    print(f"checked in {time.time() - start:.0f} s: "
          f"{'no defects' if not problems else f'{len(problems)} page views with defects'}")
    return 1 if problems else 0


if __name__ == "__main__":
    sys.exit(main())
