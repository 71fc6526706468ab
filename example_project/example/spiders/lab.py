import scrapy


class LabSpider(scrapy.Spider):
    """Crawls the lab origin's page tree, following links, up to `pages` pages.

    scrapy crawl lab -a origin=http://127.0.0.1:8000 -a pages=200
    """

    name = "lab"

    def __init__(self, origin="http://127.0.0.1:8000", pages=200, **kwargs):
        super().__init__(**kwargs)
        self.origin = origin.rstrip("/")
        self.pages = int(pages)

    async def start(self):
        yield scrapy.Request(f"{self.origin}/page/0")

    def parse(self, response):
        yield {"url": response.url, "exit": response.meta.get("exitlimit_exit")}
        for href in response.css("a::attr(href)").getall():
            n = int(href.rsplit("/", 1)[-1]) if "/page/" in href else -1
            if 0 <= n < self.pages:
                yield response.follow(href)
