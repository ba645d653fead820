"""A subscribe-style market-data feed with an API key: a fake of the feed
(:mod:`.fake_feed`), an example handler (:mod:`.handler`) and a walkthrough
(README.md in this directory)."""
