"""Tickline, a ticker feed with its own framing and a session call before each
connect: the worked example of a protocol plug-in (:mod:`.protocol`), a fake of the
feed (:mod:`.fake_feed`) and a walkthrough (README.md in this directory)."""
