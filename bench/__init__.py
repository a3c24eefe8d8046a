"""Switchboard's benchmark suite: ingest, end-to-end, concurrency, memory and formatting,
each reported beside a baseline measured in the same run. See bench/README.md."""
