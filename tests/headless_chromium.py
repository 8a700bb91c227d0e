"""Headless Chromium driven by Selenium, from Debian's `chromium` and `chromium-driver`
packages (.ci/run installs them): what the HTML report's browser test and
tests/benchmarks/bench_html_report.py open pages in. Nothing downloads a browser: the binary
and the driver are named by path and Selenium Manager is kept offline."""

from __future__ import annotations

import json
import os
import shutil
from collections.abc import Iterator
from contextlib import contextmanager
from typing import Any

BROWSER = os.environ.get("SIEVERAG_CHROMIUM", "/usr/bin/chromium")
DRIVER = os.environ.get("SIEVERAG_CHROMEDRIVER", "/usr/bin/chromedriver")
INSTALL = "apt-get update && apt-get install -y chromium chromium-driver"


def missing() -> str | None:
    """Why the browser cannot start here (what to install); None when it can."""
    absent = [path for path in (BROWSER, DRIVER) if not shutil.which(path)]
    return (f"{', '.join(absent)} not found: install Debian's browser and its driver "
            f"({INSTALL}), or name them in SIEVERAG_CHROMIUM / SIEVERAG_CHROMEDRIVER"
            if absent else None)


@contextmanager
def chromium(width: int = 1280, height: int = 900) -> Iterator[Any]:
    """A headless Chromium WebDriver whose browser log (console) and performance log (network
    events) can be read; quit on exit."""
    problem = missing()
    if problem:
        raise RuntimeError(problem)
    os.environ["SE_OFFLINE"] = "true"  # Selenium Manager may fetch nothing
    from selenium import webdriver
    from selenium.webdriver.chrome.service import Service

    options = webdriver.ChromeOptions()
    options.binary_location = BROWSER
    for argument in ("--headless=new", "--no-sandbox", "--disable-gpu",
                     "--disable-dev-shm-usage", "--no-first-run", "--disable-extensions",
                     "--disable-background-networking", "--disable-component-update",
                     f"--window-size={width},{height}"):
        options.add_argument(argument)
    options.set_capability("goog:loggingPrefs", {"browser": "ALL", "performance": "ALL"})
    driver = webdriver.Chrome(service=Service(DRIVER), options=options)
    try:
        yield driver
    finally:
        driver.quit()


def console_errors(driver: Any) -> list[str]:
    """The browser console's errors since the last read (SEVERE entries)."""
    return [entry["message"] for entry in driver.get_log("browser")
            if entry.get("level") == "SEVERE"]


def requested_urls(driver: Any) -> list[str]:
    """Every URL the page requested since the last read (the performance log's
    Network.requestWillBeSent events)."""
    urls = []
    for entry in driver.get_log("performance"):
        message = json.loads(entry["message"])["message"]
        if message.get("method") == "Network.requestWillBeSent":
            urls.append(message["params"]["request"]["url"])
    return urls
