"""The project's command-line helpers (a package so that tests can import them)."""
