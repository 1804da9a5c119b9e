"""``python -m benchmarks.admin_volume``: the admin's pages and a /metrics scrape timed on a
jobs table of millions of rows (issue 32, item 4); see __main__.py."""
