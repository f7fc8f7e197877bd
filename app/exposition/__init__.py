"""The Prometheus text exposition format: the lowest layer of the scrape path.

Engine adapters (:mod:`app.sources`) and the scraper (:mod:`app.scrape`) both read parsed
pages, so the parser lives below both of them and imports nothing else from ``app``.
"""
