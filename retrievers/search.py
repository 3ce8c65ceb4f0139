"""Web search behind the :class:`~halluscope.core.retrieval.Retriever` interface: an HTTP JSON search API.

**Off by default.** It runs only when a program lists ``search`` among its sources *and* a URL is configured
(``-O search=URL``, ``make_retriever("search:URL")`` or ``$HALLUSCOPE_SEARCH_URL``); the API key is read from
``$HALLUSCOPE_SEARCH_KEY`` (or the variable named by ``key_env``) and sent as ``Authorization: Bearer <key>``,
never stored or logged.

The request is ``GET <url>?q=<query>&k=<k>`` (parameter names configurable). The answer is JSON: a list of
results, or an object holding one under ``results``, ``items``, ``organic`` or ``data``; each result's text
is its ``snippet``, ``text``, ``content`` or ``description`` (with ``title`` in front when present) and its
id its ``url``/``link``/``id``. Anything else — a timeout (default 10 s), an HTTP error status such as 500, a
connection refused, a body that is not JSON of that shape — raises :class:`SearchError` with a message that
names the server and what went wrong; programs count it as a failed source and go on with the others.
"""

from __future__ import annotations

import json
import os
import socket
import urllib.error
import urllib.parse
import urllib.request

from halluscope.core.contract import Evidence
from halluscope.core.retrieval import register_retriever

__all__ = ["SearchError", "SearchRetriever", "URL_ENV", "KEY_ENV"]

URL_ENV = "HALLUSCOPE_SEARCH_URL"
KEY_ENV = "HALLUSCOPE_SEARCH_KEY"
_LISTS = ("results", "items", "organic", "data")
_TEXTS = ("snippet", "text", "content", "description")
_IDS = ("url", "link", "id")


class SearchError(RuntimeError):
    """The search server could not be used (timeout, HTTP error, bad answer)."""


class SearchRetriever:
    """Snippets from an HTTP JSON search API (see the module docstring).

    Args:
        url: the search endpoint (default ``$HALLUSCOPE_SEARCH_URL``).
        key_env: environment variable holding the API key (none set: no Authorization header).
        timeout: seconds to wait for the server.
        query_param / k_param: names of the query and result-count parameters.
    """

    source = "search"

    def __init__(self, url: str = "", key_env: str = KEY_ENV, timeout: float = 10.0, query_param: str = "q",
                 k_param: str = "k"):
        url = (url or os.environ.get(URL_ENV, "")).strip()
        if not url:
            raise SearchError(f"web search is off: give a search API URL (-O search=URL, 'search:URL' or "
                              f"${URL_ENV}); the key is read from ${key_env}")
        if urllib.parse.urlparse(url).scheme not in ("http", "https"):
            raise SearchError(f"search URL must be http(s)://..., not {url!r}")
        self.url, self.key_env, self.timeout = url, key_env, float(timeout)
        self.query_param, self.k_param = query_param, k_param

    def _request(self, query: str, k: int) -> urllib.request.Request:
        sep = "&" if urllib.parse.urlparse(self.url).query else "?"
        url = f"{self.url}{sep}{urllib.parse.urlencode({self.query_param: query, self.k_param: k})}"
        headers = {"Accept": "application/json", "User-Agent": "halluscope"}
        key = os.environ.get(self.key_env, "")
        if key:
            headers["Authorization"] = f"Bearer {key}"
        return urllib.request.Request(url, headers=headers)

    def retrieve(self, query: str, *, k: int = 5, context: str = "") -> list[Evidence]:
        if not (query or "").strip() or k <= 0:
            return []
        try:
            with urllib.request.urlopen(self._request(query, k), timeout=self.timeout) as resp:
                body = resp.read()
        except urllib.error.HTTPError as e:
            raise SearchError(f"search server {self.url} returned HTTP {e.code} ({e.reason})") from None
        except (TimeoutError, socket.timeout):
            raise SearchError(f"search server {self.url} did not answer within {self.timeout:g} s") from None
        except urllib.error.URLError as e:
            if isinstance(e.reason, (TimeoutError, socket.timeout)):
                raise SearchError(f"search server {self.url} did not answer within {self.timeout:g} s") from None
            raise SearchError(f"search server {self.url} cannot be reached ({e.reason})") from None
        try:
            data = json.loads(body)
        except (json.JSONDecodeError, UnicodeDecodeError):
            raise SearchError(f"search server {self.url} did not return JSON ({body[:80]!r})") from None
        results = data
        if isinstance(data, dict):
            results = next((data[key] for key in _LISTS if isinstance(data.get(key), list)), None)
        if not isinstance(results, list):
            raise SearchError(f"search server {self.url} returned JSON without a result list "
                              f"(expected a list or one of {', '.join(_LISTS)})")
        out: list[Evidence] = []
        for rank, r in enumerate(results):
            if not isinstance(r, dict):
                continue
            text = next((str(r[f]) for f in _TEXTS if r.get(f)), "")
            if not text.strip():
                continue
            title = str(r.get("title") or "").strip()
            out.append(Evidence(text=f"{title}: {text}" if title else text, source=self.source,
                                id=str(next((r[f] for f in _IDS if r.get(f)), f"result{rank}")),
                                score=round(1.0 / (rank + 1), 6)))
            if len(out) >= k:
                break
        return out

    def cache_key(self) -> str:
        return f"search?url={self.url}"


register_retriever("search", SearchRetriever)  # make_retriever("search:ARG") builds SearchRetriever(ARG)
