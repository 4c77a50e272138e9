"""The admin dashboard in a real browser: Debian's chromium, headless, driven by selenium through
Debian's chromedriver (scripts/install-browser installs both; nothing is downloaded).

A real coordinator (uvicorn on a loopback port) runs a small FedNoRo federation of four SDK
sites, one of them with shuffled labels. The browser logs in through the form, follows the links
from the federation list to the report, to every client's page and to a round's page, and on
every page checks the title, that the page's own plots are there, and that the browser's console
logged no error. Screenshots go to ``FEDAUDIT_ARTIFACTS_DIR`` (default ``artifacts/``, ignored by
git) for CI to keep.

Without chromium and chromedriver the test is skipped, unless ``FEDAUDIT_REQUIRE_BROWSER=1``
(CI), which makes their absence a failure.
"""

from __future__ import annotations

import os
import shutil
from collections.abc import Iterator
from pathlib import Path

import pytest

from fedaudit_sim.coordinator_process import CoordinatorProcess
from tests.e2e.test_methods_e2e import NAMES, run_federation

pytestmark = [pytest.mark.slow, pytest.mark.browser]

ROOT = Path(__file__).resolve().parents[2]


def _browser() -> tuple[str, str]:
    chromium, driver = shutil.which("chromium"), shutil.which("chromedriver")
    if chromium is None or driver is None:
        message = "Debian's chromium and chromedriver are needed (scripts/install-browser)"
        if os.environ.get("FEDAUDIT_REQUIRE_BROWSER") == "1":
            pytest.fail(message)
        pytest.skip(message)
    return chromium, driver


@pytest.fixture(scope="module")
def server(tmp_path_factory: pytest.TempPathFactory) -> Iterator[CoordinatorProcess]:
    with CoordinatorProcess(tmp_path_factory.mktemp("browser")) as process:
        yield process


@pytest.fixture
def browser() -> Iterator[object]:
    chromium, driver_path = _browser()
    try:
        from selenium import webdriver
    except ImportError:  # the dev extra installs it
        if os.environ.get("FEDAUDIT_REQUIRE_BROWSER") == "1":
            pytest.fail("selenium is not installed (scripts/setup --dev)")
        pytest.skip("selenium is not installed (scripts/setup --dev)")
    options = webdriver.ChromeOptions()
    options.binary_location = chromium
    for argument in (
        "--headless=new",
        "--no-sandbox",
        "--disable-gpu",
        "--disable-dev-shm-usage",  # a container's /dev/shm is 64 MB
        "--window-size=1400,1200",
    ):
        options.add_argument(argument)
    options.set_capability("goog:loggingPrefs", {"browser": "ALL"})
    driver = webdriver.Chrome(options=options, service=webdriver.ChromeService(driver_path))
    try:
        yield driver
    finally:
        driver.quit()


def _artifacts() -> Path:
    folder = Path(os.environ.get("FEDAUDIT_ARTIFACTS_DIR", ROOT / "artifacts")) / "browser"
    folder.mkdir(parents=True, exist_ok=True)
    return folder


def _check_page(driver, shot: str, plots: set[str]) -> None:
    """The page's title names fedaudit, its plots are there, the console has no error (the
    screenshot is taken first, so that a failing page has one)."""
    from selenium.webdriver.common.by import By

    driver.save_screenshot(str(_artifacts() / f"{shot}.png"))
    assert driver.title.endswith("fedaudit"), driver.title
    labels = {e.get_attribute("aria-label") for e in driver.find_elements(By.TAG_NAME, "svg")}
    assert plots <= labels, (plots, labels)
    errors = [e for e in driver.get_log("browser") if e["level"] == "SEVERE"]
    assert errors == [], errors


def test_an_operator_follows_the_dashboard_from_login_to_every_client(
    server: CoordinatorProcess, browser
) -> None:
    from selenium.webdriver.common.by import By
    from selenium.webdriver.support.ui import WebDriverWait

    # Prepare: a finished federation (3 rounds, the first the warm-up; site-3 is noisy)
    admin, federation_id, _ = run_federation(server, "fednoro")
    admin.close()
    driver = browser

    # Log in through the form
    driver.get(f"{server.url}/admin/login")
    _check_page(driver, "login", set())
    driver.find_element(By.NAME, "token").send_keys(server.admin_token)
    driver.find_element(By.CSS_SELECTOR, "form button[type=submit]").click()
    WebDriverWait(driver, 20).until(lambda d: d.current_url.rstrip("/").endswith("/admin"))
    _check_page(driver, "federations", set())

    # The federation list -> the report
    driver.find_element(By.CSS_SELECTOR, f'a[href$="/federations/{federation_id}"]').click()
    WebDriverWait(driver, 20).until(lambda d: d.current_url.endswith(federation_id))
    _check_page(driver, "report", {"flags over rounds", "reliable-neighbor matrix"})
    links = {
        a.text: a.get_attribute("href")
        for a in driver.find_elements(By.CSS_SELECTOR, 'a[href*="/clients/"]')
    }
    assert set(links) == set(NAMES)
    round_link = driver.find_element(By.CSS_SELECTOR, 'a[href$="/rounds/2"]').get_attribute("href")

    # Every client's page, reached by its link
    for name in NAMES:
        driver.get(links[name])
        assert driver.find_element(By.TAG_NAME, "h1").text == name
        neighbors = [n for n in NAMES if n != name and f"{n} (0." in driver.page_source]
        assert neighbors, "FedRN's neighbors are listed by name"
        _check_page(driver, f"client-{name}", {"flags per detector", "per-class loss over rounds"})

    # A round's page
    assert round_link is not None
    driver.get(round_link)
    assert driver.find_element(By.TAG_NAME, "h1").text == "Round 2"
    _check_page(driver, "round-2", {"aggregation weights, round 2"})

    # The icon where browsers look for it by default: served, no 404 in the console
    driver.get(f"{server.url}/favicon.ico")
    assert driver.find_elements(By.TAG_NAME, "svg"), driver.page_source[:200]
    assert [e for e in driver.get_log("browser") if e["level"] == "SEVERE"] == []
