import pytest
from scrapy import Request

from scrapy_exitlimit.middleware import origin_of


@pytest.mark.parametrize(
    ("url", "meta", "expected"),
    [
        ("http://Example.COM/a?b", {}, "http://example.com"),
        ("http://example.com:80/", {}, "http://example.com"),
        ("https://example.com:443/", {}, "https://example.com"),
        ("https://example.com:8443/x", {}, "https://example.com:8443"),
        ("http://127.0.0.1:8000/page/1", {}, "http://127.0.0.1:8000"),
        ("https://a.example.com/", {"exitlimit_origin": "example.com"}, "example.com"),
    ],
)
def test_origin_key(url, meta, expected):
    assert origin_of(Request(url, meta=meta)) == expected


def test_origins_are_remembered_per_host_but_never_without_bound():
    """Every request asks for its origin: the answer is kept per (scheme, host), and a
    crawl of ever new hosts drops the least recent instead of growing the memo."""
    from scrapy_exitlimit import middleware

    bound = middleware._origin.cache_info().maxsize
    for n in range(bound + 10):
        assert origin_of(Request(f"http://h{n}.example.com:81/x")) == \
            f"http://h{n}.example.com:81"
    assert middleware._origin.cache_info().currsize <= bound
    # the same host under another scheme or port is another origin
    assert origin_of(Request("https://h1.example.com:81/")) == "https://h1.example.com:81"
    assert origin_of(Request("http://h1.example.com/")) == "http://h1.example.com"
