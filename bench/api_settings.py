"""Settings for bench/api.py: the product's settings, plus one minimal JSON view (the baseline)."""

from ledgerweb.settings import *  # noqa: F403

ROOT_URLCONF = "bench.api_urls"
