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
